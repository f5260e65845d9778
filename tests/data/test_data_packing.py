"""Packing layouts and per-segment targets, checked against naive references."""

from __future__ import annotations

import json

import numpy as np
import pytest

from composer_jax.data import packing, shards
from composer_jax.data.targets import add_targets


def _naive_targets(tokens, segment_ids, trainable, offset):
    """Per position: the token `offset` ahead if it is in the same (non-padding) document."""
    batch, length = tokens.shape
    targets = np.zeros((batch, length), np.int32)
    mask = np.zeros((batch, length), np.float32)
    for b in range(batch):
        for i in range(length):
            j = i + offset
            if j < length and segment_ids[b, i] != 0 and all(segment_ids[b, k] == segment_ids[b, i]
                                                            for k in range(i, j + 1)):
                targets[b, i] = tokens[b, j]
                mask[b, i] = float(trainable[b, j])
    return targets, mask


def _random_rows(rng, batch, length):
    segment_ids = np.zeros((batch, length), np.int32)
    for b in range(batch):
        pos, seg = 0, 1
        while pos < length:
            n = int(rng.integers(1, 9))
            segment_ids[b, pos:pos + n] = seg if rng.random() > 0.15 else 0
            seg += 1
            pos += n
        # renumber non-padding runs 1..k as the packer does
        runs = np.cumsum(np.diff(segment_ids[b], prepend=-1) != 0)
        segment_ids[b] = np.where(segment_ids[b] == 0, 0, runs)
    tokens = rng.integers(1, 1000, size=(batch, length)).astype(np.int32)
    trainable = (rng.random((batch, length)) > 0.3).astype(np.uint8)
    positions = np.zeros_like(tokens)
    return {"tokens": tokens, "segment_ids": segment_ids, "positions": positions, "trainable": trainable}


@pytest.mark.parametrize("depth", [0, 1, 3, 40])
def test_targets_match_naive_reference(depth):
    rng = np.random.default_rng(depth)
    rows = _random_rows(rng, 3, 37)
    batch = add_targets(rows, depth)
    want, want_mask = _naive_targets(rows["tokens"], rows["segment_ids"], rows["trainable"], 1)
    np.testing.assert_array_equal(batch["targets"], want)
    np.testing.assert_array_equal(batch["loss_mask"], want_mask)
    assert batch["mtp_targets"].shape == (3, depth, 37) and batch["mtp_mask"].dtype == np.float32
    for k in range(1, depth + 1):
        want, want_mask = _naive_targets(rows["tokens"], rows["segment_ids"], rows["trainable"], 1 + k)
        np.testing.assert_array_equal(batch["mtp_targets"][:, k - 1], want)
        np.testing.assert_array_equal(batch["mtp_mask"][:, k - 1], want_mask)


def _store(tmp_path, docs, trainable=None):
    trainable = trainable or [None] * len(docs)
    shards.write_store(tmp_path, "s", zip(docs, trainable), np.dtype(np.uint16))
    (tmp_path / "info.json").write_text(json.dumps({"dtype": "uint16", "key": "k"}))
    return shards.TokenStore(tmp_path, "s")


def _docs(rng, n, max_len):
    return [list(rng.integers(17, 600, size=int(rng.integers(1, max_len)))) for _ in range(n)]


def test_value_start_targets_carry_the_value_weight():
    """trainable code 2 (an argument value's first token) weighs `value_weight` in every mask that
    targets it; code 1 weighs 1; padding and other documents stay 0; weight 1 gives the 0/1 mask."""
    rows = {"tokens": np.arange(10, 18)[None], "positions": np.arange(8)[None],
            "segment_ids": np.array([[1, 1, 1, 1, 1, 1, 0, 0]]),
            "trainable": np.array([[0, 0, 1, 2, 1, 2, 2, 0]], np.uint8)}
    batch = add_targets(rows, 1, value_weight=5.0)
    assert batch["loss_mask"][0].tolist() == [0, 1, 5, 1, 5, 0, 0, 0]
    assert batch["mtp_mask"][0, 0].tolist() == [1, 5, 1, 5, 0, 0, 0, 0]
    plain = add_targets(rows, 1)
    assert plain["loss_mask"][0].tolist() == [0, 1, 1, 1, 1, 0, 0, 0]
    assert (plain["targets"] == batch["targets"]).all()


def test_stream_layout_reassembles_documents(tmp_path):
    rng = np.random.default_rng(0)
    docs = _docs(rng, 40, 50)
    store = _store(tmp_path, docs)
    seq_len = 16
    layout = packing.StreamLayout(store.lengths, seq_len, seed=3, shuffle=True, keep_tail=True)
    for epoch in (0, 1):
        pieces_by_doc: dict[int, list] = {}
        stream = []
        for row in range(layout.rows_per_epoch):
            pieces = layout.pieces(epoch, row)
            arrays = packing.assemble_row(pieces, store, seq_len, pad_id=0)
            for k, (doc, doc_off, row_off, n) in enumerate(pieces):
                seg = arrays["segment_ids"][row_off:row_off + n]
                assert (seg == k + 1).all()
                np.testing.assert_array_equal(arrays["positions"][row_off:row_off + n], np.arange(n))
                pieces_by_doc.setdefault(doc, []).append((doc_off, arrays["tokens"][row_off:row_off + n]))
            stream.append(arrays["segment_ids"])
        assert sorted(pieces_by_doc) == list(range(len(docs)))
        for doc, parts in pieces_by_doc.items():
            np.testing.assert_array_equal(np.concatenate([p for _, p in sorted(parts, key=lambda x: x[0])]),
                                          docs[doc])
        padding = int((np.concatenate(stream) == 0).sum())
        assert padding == layout.rows_per_epoch * seq_len - sum(map(len, docs)) < seq_len
    first_docs = [layout.pieces(e, 0)[0][0] for e in range(4)]
    assert len(set(first_docs)) > 1  # epochs are reshuffled


def test_bin_layout_never_cuts_samples(tmp_path):
    rng = np.random.default_rng(1)
    docs = _docs(rng, 60, 30) + [[20] * 40]  # the last one is longer than a row
    masks = [list(rng.integers(0, 2, size=len(d))) for d in docs]
    store = _store(tmp_path, docs, masks)
    layout = packing.BinLayout(store.lengths, 32, seed=0)
    assert layout.dropped == 1
    for epoch in (0, 1):
        seen = []
        for row in range(layout.rows_per_epoch):
            pieces = layout.pieces(epoch, row)
            arrays = packing.assemble_row(pieces, store, 32, pad_id=0)
            assert sum(p[3] for p in pieces) <= 32
            for doc, doc_off, row_off, n in pieces:
                assert doc_off == 0 and n == len(docs[doc])
                np.testing.assert_array_equal(arrays["trainable"][row_off:row_off + n], masks[doc])
                seen.append(doc)
        assert sorted(seen) == list(range(60))


def test_best_fit_decreasing_respects_capacity():
    lengths = np.array([5, 9, 3, 7, 1, 10, 2, 8])
    bins = packing.best_fit_decreasing(lengths, np.arange(len(lengths)), 10)
    assert sorted(i for b in bins for i in b) == list(range(8))
    assert all(lengths[b].sum() <= 10 for b in bins)
    assert len(bins) == 5  # optimal here: total 45 -> at least 5 bins
