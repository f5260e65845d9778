"""The grain pipelines: batch contract, determinism, resume, per-host sharding, eval, SFT masks."""

from __future__ import annotations

import dataclasses
import itertools
import json

import numpy as np
import pytest

from composer_jax.data import special_tokens as st
from composer_jax.data.errors import DataError
from composer_jax.data.loaders import make_eval_batches, make_sft_iterator, make_train_iterator
from composer_jax.data.recall_rows import IGNORED, KEY, VALUE_FIRST, recall_segment
from composer_jax.data.shards import build_or_load_shards
from composer_jax.errors import ConfigError

KEYS = {"tokens": np.int32, "positions": np.int32, "segment_ids": np.int32, "targets": np.int32,
        "loss_mask": np.float32, "mtp_targets": np.int32, "mtp_mask": np.float32}


def _take(iterator, n):
    return [next(iterator) for _ in range(n)]


def _assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for key in KEYS:
            np.testing.assert_array_equal(x[key], y[key])


def test_batch_contract(small_data):
    cfg, corpus, tok = small_data
    batch = next(make_train_iterator(cfg, tok, 2, 0, 1, corpus=corpus))
    B, T = cfg.global_batch_size, cfg.seq_len
    for key, dtype in KEYS.items():
        assert batch[key].dtype == dtype, key
        assert batch[key].shape == ((B, 2, T) if key.startswith("mtp") else (B, T)), key
    seg, tokens = batch["segment_ids"], batch["tokens"]
    for b in range(B):
        for i in range(T):
            if i + 1 < T and seg[b, i + 1] == seg[b, i] != 0:
                assert batch["targets"][b, i] == tokens[b, i + 1] and batch["loss_mask"][b, i] == 1
            else:
                assert batch["targets"][b, i] == 0 and batch["loss_mask"][b, i] == 0
            if i == 0 or seg[b, i] != seg[b, i - 1]:
                assert batch["positions"][b, i] == 0
            else:
                assert batch["positions"][b, i] == batch["positions"][b, i - 1] + 1
    assert (seg > 0).all()  # pretraining rows are fully packed
    assert tok.special.bos in tokens


def test_deterministic_and_resumable(small_data):
    cfg, corpus, tok = small_data
    reference = _take(make_train_iterator(cfg, tok, 1, 0, 1, corpus=corpus), 12)
    _assert_same(reference, _take(make_train_iterator(cfg, tok, 1, 0, 1, corpus=corpus), 12))
    interrupted = make_train_iterator(cfg, tok, 1, 0, 1, corpus=corpus)
    _take(interrupted, 5)
    state = json.loads(json.dumps(interrupted.get_state()))  # must survive a JSON checkpoint
    resumed = make_train_iterator(cfg, tok, 1, 0, 1, start_state=state, corpus=corpus)
    _assert_same(reference[5:], _take(resumed, 7))
    other_seed = make_train_iterator(dataclasses.replace(cfg, shuffle_seed=1), tok, 1, 0, 1, corpus=corpus)
    with pytest.raises(DataError, match="shuffle_seed"):
        other_seed.set_state(state)
    assert not all(np.array_equal(a["tokens"], b["tokens"]) for a, b in zip(reference, _take(other_seed, 12)))


def test_iterates_across_epochs(small_data):
    cfg, corpus, tok = small_data
    store = build_or_load_shards(cfg, corpus, tok)["train"]
    per_epoch = store.num_tokens // cfg.seq_len // cfg.global_batch_size
    batches = _take(make_train_iterator(cfg, tok, 1, 0, 1, corpus=corpus), per_epoch + 2)
    assert all(b["tokens"].shape == (cfg.global_batch_size, cfg.seq_len) for b in batches)
    assert not np.array_equal(batches[0]["tokens"], batches[per_epoch + 1]["tokens"])  # reshuffled


@pytest.mark.parametrize("process_count", [2, 4])
def test_hosts_are_disjoint_and_cover_the_global_batch(small_data, process_count):
    cfg, corpus, tok = small_data
    single = _take(make_train_iterator(cfg, tok, 2, 0, 1, corpus=corpus), 3)
    hosts = [_take(make_train_iterator(cfg, tok, 2, p, process_count, corpus=corpus), 3) for p in range(process_count)]
    for step in range(3):
        parts = [h[step] for h in hosts]
        assert all(p["tokens"].shape[0] == cfg.global_batch_size // process_count for p in parts)
        for key in KEYS:  # host p holds rows [p*B, (p+1)*B) of the global batch
            np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), single[step][key])
    with pytest.raises(DataError, match="not divisible"):
        make_train_iterator(cfg, tok, 2, 0, 3, corpus=corpus)
    with pytest.raises(DataError, match="process_index"):
        make_train_iterator(cfg, tok, 2, 2, 2, corpus=corpus)


def test_eval_batches_cover_validation_once(small_data):
    cfg, corpus, tok = small_data
    batches = make_eval_batches(cfg, tok, 1, 0, 1, corpus=corpus)
    texts = [tok.encode(t) for t in corpus.iter_texts("validation")]
    expected = sum(len(t) + 2 for t in texts)  # BOS + text + EOS per document
    seen = sum(int((b["segment_ids"] > 0).sum()) for b in batches)
    assert seen == expected and len(batches) == len(list(batches))
    hosts = [make_eval_batches(cfg, tok, 1, p, 2, corpus=corpus) for p in range(2)]
    assert len(hosts[0]) == len(hosts[1]) == len(batches)
    capped = make_eval_batches(dataclasses.replace(cfg, eval_max_batches=1), tok, 1, 0, 1, corpus=corpus)
    assert len(capped) == 1


def test_sft_loss_only_on_assistant_tokens(small_data):
    cfg, corpus, tok = small_data
    cfg = dataclasses.replace(cfg, seq_len=512)
    batch = next(make_sft_iterator(cfg, tok, 1, 0, 1, corpus=corpus))
    ids = tok.special.by_token
    checked = 0
    for b in range(cfg.global_batch_size):
        seg = batch["segment_ids"][b]
        for s in set(seg.tolist()) - {0}:
            where = np.flatnonzero(seg == s)
            tokens = batch["tokens"][b, where]
            assert tokens[0] == tok.special.bos and tokens[-1] == ids[st.IM_END]
            # the answer's header is <|im_assistant|>assistant<|im_middle|>; the token predicting the
            # first answer token is that <|im_middle|>
            start = int(np.flatnonzero(tokens == ids[st.IM_MIDDLE])[-1])
            trained = batch["loss_mask"][b, where] > 0
            # a target is trained iff it is an assistant-content token or the closing <|im_end|>
            np.testing.assert_array_equal(np.flatnonzero(trained), np.arange(start, len(where) - 1))
            answer = tok.decode(batch["targets"][b, where][trained])
            assert answer.endswith(st.IM_END) and answer.lstrip().startswith(("def ", "async def", "@"))
            checked += 1
    assert checked > 0


def test_bad_pipeline_arguments(small_data):
    cfg, corpus, tok = small_data
    with pytest.raises(DataError, match="mtp_depth"):
        make_train_iterator(cfg, tok, -1, 0, 1, corpus=corpus)
    big = dataclasses.replace(cfg, seq_len=1 << 20)
    with pytest.raises(DataError, match="fewer than one global batch"):
        make_train_iterator(big, tok, 1, 0, 1, corpus=corpus)


@pytest.mark.slow
def test_worker_processes_give_the_same_batches(small_data):
    cfg, corpus, tok = small_data
    reference = _take(make_train_iterator(cfg, tok, 1, 0, 1, corpus=corpus), 6)
    iterator = make_train_iterator(dataclasses.replace(cfg, num_workers=2), tok, 1, 0, 1, corpus=corpus)
    try:
        _assert_same(reference, list(itertools.islice(iterator, 6)))
    finally:
        iterator.close()


def test_copy_rows_repeat_spans_of_their_own_first_half(small_data):
    """data.copy_rows: about that share of rows are one segment whose second half is made of spans of
    the first half (each copied token's target is the source's next token: induction); other rows
    are the plain rows; same state meta otherwise, and resumable."""
    cfg, corpus, tok = small_data
    cfg = dataclasses.replace(cfg, seq_len=256)
    copied = dataclasses.replace(cfg, copy_rows=0.5)
    plain_rows = [r for b in _take(make_train_iterator(cfg, tok, 1, 0, 1, corpus=corpus), 8) for r in b["tokens"]]
    iterator = make_train_iterator(copied, tok, 1, 0, 1, corpus=corpus)
    batches = _take(iterator, 8)
    T, h = cfg.seq_len, cfg.seq_len - cfg.seq_len // 2
    n_copy = 0
    for batch in batches:
        for b, tokens in enumerate(batch["tokens"]):
            if any(np.array_equal(tokens, p) for p in plain_rows):
                continue
            n_copy += 1
            assert (batch["segment_ids"][b] == 1).all()
            np.testing.assert_array_equal(batch["positions"][b], np.arange(T))
            assert batch["loss_mask"][b, :T - 1].all()
            # every window of 8 tokens of the second half occurs in the first half, unless it straddles
            # two spans (spans are 16-128 tokens: ~10% straddle)
            source = {tuple(tokens[i:i + 8]) for i in range(h - 7)}
            windows = [tuple(tokens[i:i + 8]) for i in range(h, T - 7)]
            assert np.mean([w in source for w in windows]) > 0.75
    rows = 8 * cfg.global_batch_size
    assert 0.25 * rows < n_copy < 0.75 * rows
    assert iterator.meta["copy_rows"] == 0.5
    assert "copy_rows" not in make_train_iterator(cfg, tok, 1, 0, 1, corpus=corpus).meta
    resumed = make_train_iterator(copied, tok, 1, 0, 1, corpus=corpus)
    _take(resumed, 3)
    again = make_train_iterator(copied, tok, 1, 0, 1, corpus=corpus, start_state=resumed.get_state())
    _assert_same(batches[3:6], _take(again, 3))
    with pytest.raises(DataError):
        make_train_iterator(cfg, tok, 1, 0, 1, corpus=corpus, start_state=resumed.get_state())


def test_copy_rows_from_random_ids(small_data):
    """data.copy_source=random: every copy row's first half is random non-special ids and its
    second half is spans of them."""
    cfg, corpus, tok = small_data
    cfg = dataclasses.replace(cfg, seq_len=256, copy_rows=1.0, copy_source="random")
    T, h = cfg.seq_len, cfg.seq_len - cfg.seq_len // 2
    batch = next(make_train_iterator(cfg, tok, 1, 0, 1, corpus=corpus))
    assert not batch["loss_mask"][:, :h - 1].any() and batch["loss_mask"][:, h:T - 1].all()
    for tokens in batch["tokens"]:
        assert tokens.min() >= len(st.ALL_SPECIAL_TOKENS) and tokens.max() < tok.vocab_size
        source = {tuple(tokens[i:i + 8]) for i in range(h - 7)}
        assert np.mean([tuple(tokens[i:i + 8]) in source for i in range(h, T - 7)]) > 0.75
    assert len(set(batch["tokens"][:, :h].ravel().tolist())) > 0.5 * min(tok.vocab_size, h * len(batch["tokens"]))


def test_copy_settings_that_would_do_nothing_are_refused(small_data):
    """copy_source / copy_random_ids / copy_source_tokens without copy rows, copy_random_ids on code
    sources, and a source too long for its copy to fit the row are errors, not silent no-ops."""
    cfg, corpus, tok = small_data
    for bad in ({"copy_source": "random"}, {"copy_random_ids": 64}, {"copy_source_tokens": 16},
                {"copy_rows": 0.5, "copy_random_ids": 64},
                {"copy_rows": 0.5, "copy_source_tokens": cfg.seq_len // 2 + 1}):
        with pytest.raises(ConfigError, match="copy"):
            dataclasses.replace(cfg, **bad)
    dataclasses.replace(cfg, copy_rows=0.5, copy_source="random", copy_random_ids=64)  # accepted
    dataclasses.replace(cfg, copy_rows=0.5, copy_source_tokens=cfg.seq_len // 2)  # accepted


@pytest.mark.parametrize("source", ["random", "code"])
def test_copy_rows_of_short_sources_are_segments_at_that_distance(small_data, source):
    """data.copy_source_tokens=n: a copy row is T // 2n segments (ids 1..k, positions restarting),
    each n source tokens then spans of them (8-16 tokens for n=32) up to 2n tokens, the last to
    the row's end; random sources carry no loss, every copied token does (bar the segment's last)."""
    cfg, corpus, tok = small_data
    n, T = 32, 200
    cfg = dataclasses.replace(cfg, seq_len=T, copy_rows=1.0, copy_source=source, copy_source_tokens=n)
    iterator = make_train_iterator(cfg, tok, 1, 0, 1, corpus=corpus)
    batch = next(iterator)
    assert iterator.meta["copy_source_tokens"] == n
    for b, tokens in enumerate(batch["tokens"]):
        seg, pos, mask = batch["segment_ids"][b], batch["positions"][b], batch["loss_mask"][b]
        assert sorted(set(seg.tolist())) == [1, 2, 3]           # 200 // 64 = 3 segments
        for k, (start, end) in enumerate([(0, 64), (64, 128), (128, T)]):
            assert (seg[start:end] == k + 1).all()
            np.testing.assert_array_equal(pos[start:end], np.arange(end - start))
            assert mask[start + n:end - 1].all() and not mask[end - 1]
            if source == "random":
                assert not mask[start:start + n - 1].any()
            src = {tuple(tokens[start + i:start + i + 3]) for i in range(n - 2)}
            windows = [tuple(tokens[i:i + 3]) for i in range(start + n, end - 2)]
            assert np.mean([w in src for w in windows]) > 0.6   # spans of 8-16: ~1/6 straddle two


def test_sft_batches_take_copy_rows(small_data):
    """data.copy_rows in SFT: that share of rows are copy rows (all loss on copies of random ids),
    the rest keep the chat loss mask (assistant tokens only)."""
    cfg, corpus, tok = small_data
    cfg = dataclasses.replace(cfg, seq_len=512)
    plain = next(make_sft_iterator(cfg, tok, 1, 0, 1, corpus=corpus))
    mixed_cfg = dataclasses.replace(cfg, copy_rows=0.5, copy_source="random", copy_source_tokens=32)
    iterator = make_sft_iterator(mixed_cfg, tok, 1, 0, 1, corpus=corpus)
    batches = _take(iterator, 8)
    assert iterator.meta["copy_rows"] == 0.5 and iterator.meta["kind"] == "sft"

    def is_copy_row(b, i):   # segments of 2 x 32 tokens, positions restarting at each
        return (b["segment_ids"][i].max() > 1 and (b["positions"][i][:64] == np.arange(64)).all()
                and b["positions"][i][64] == 0)

    rows = sum(len(b["tokens"]) for b in batches)
    assert 0.25 * rows < sum(is_copy_row(b, i) for b in batches for i in range(len(b["tokens"]))) < 0.75 * rows
    first = batches[0]
    for i in range(len(first["tokens"])):
        if not is_copy_row(first, i):
            assert first["loss_mask"][i].sum() < 0.9 * (first["segment_ids"][i] > 0).sum()   # chats: assistant only
    assert plain["tokens"].shape == first["tokens"].shape


def test_recall_rows_need_the_key_not_the_last_token(small_data):
    """data.copy_source=recall: segments of 2n random ids, records then queries; the loss covers the
    queries' suffix, separator and values only, and each value's first id follows its key in the
    store, while the id after the most recent earlier separator (one-token induction) is mostly
    another record's value."""
    cfg, corpus, tok = small_data
    n, T = 64, 256
    with pytest.raises(ConfigError, match="copy_source_tokens"):
        dataclasses.replace(cfg, seq_len=T, copy_rows=1.0, copy_source="recall")
    cfg = dataclasses.replace(cfg, seq_len=T, copy_rows=1.0, copy_source="recall", copy_source_tokens=n)
    batch = next(make_train_iterator(cfg, tok, 1, 0, 1, corpus=corpus))
    hits = misses = 0
    for b, tokens in enumerate(batch["tokens"]):
        assert sorted(set(batch["segment_ids"][b].tolist())) == [1, 2]
        assert tokens.min() >= len(st.ALL_SPECIAL_TOKENS) and tokens.max() < tok.vocab_size
        mask = batch["loss_mask"][b]   # mask[t]: the loss on predicting tokens[t + 1]
        assert not mask[:n - 1].any() and mask[n:].sum() > 0.4 * n
    rng = np.random.default_rng(0)
    for _ in range(50):
        ids, kinds = recall_segment(rng, 2 * n, (16, 4096), max_suffix=2)
        for t in np.flatnonzero(kinds == VALUE_FIRST):
            key_at = t - 1 - int((kinds[:t][::-1] != KEY).argmax())   # the query's key id
            gap = t - key_at
            stored = [i for i in range(gap, t) if ids[i - gap] == ids[key_at] and kinds[i] == IGNORED
                      and (ids[i - gap + 1:i] == ids[key_at + 1:t]).all()]
            assert stored and ids[stored[0]] == ids[t]          # the value stored after that key
            last_sep = max(i for i in range(t - 1) if ids[i] == ids[t - 1])
            hits, misses = hits + (ids[last_sep + 1] == ids[t]), misses + (ids[last_sep + 1] != ids[t])
    assert misses > 4 * hits   # one-token induction is wrong at most queries
