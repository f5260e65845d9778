"""Entry points that assemble corpus -> tokens -> grain batches (see `pipeline.py` for the format).

`mtp_depth` comes from the model config (its number of MTP modules), not from DataConfig, so the
data and the model can never disagree on it. `process_index` / `process_count` are plain ints (the
caller passes `jax.process_index()` / `jax.process_count()`); the data package never imports JAX.
Every host must see the same corpus and tokenizer (same cache, or identical machines): the
iterator's `meta["data"]` fingerprint makes a mismatch visible.
"""

from __future__ import annotations

import grain

from composer_jax.data import packing, pipeline, special_tokens, split
from composer_jax.data.config import CopySource, DataConfig
from composer_jax.data.copy_rows import CopySpans
from composer_jax.data.corpus import Corpus, build_or_load_corpus
from composer_jax.data.errors import DataError
from composer_jax.data.shards import TokenStore, build_or_load_shards
from composer_jax.data.sft import build_or_load_sft


def make_train_iterator(cfg: DataConfig, tokenizer, mtp_depth: int, process_index: int, process_count: int,
                        start_state: dict | None = None, *, corpus: Corpus | None = None) -> pipeline.DataIterator:
    """Infinite, reshuffled-per-epoch pretraining batches of this host's share of the global batch."""
    store = _store(cfg, tokenizer, corpus, split.TRAIN)
    layout = packing.StreamLayout(store.lengths, cfg.seq_len, cfg.shuffle_seed, shuffle=True)
    return _iterator(cfg, "cpt", store, layout, tokenizer, mtp_depth, process_index, process_count, start_state,
                     copy=_copy_spans(cfg, tokenizer.vocab_size))


def make_sft_iterator(cfg: DataConfig, tokenizer, mtp_depth: int, process_index: int, process_count: int,
                      start_state: dict | None = None, *, corpus: Corpus | None = None) -> pipeline.DataIterator:
    """Infinite SFT batches (`data.sft_source`: oracle transcripts or docstring -> function chats);
    the loss mask covers assistant tokens only (argument values' first tokens weigh
    `data.sft_value_weight`); `data.copy_rows` replaces that share of rows by copy
    rows (which keep an induction circuit alive while the chats train)."""
    corpus = corpus or build_or_load_corpus(cfg)
    store = build_or_load_sft(cfg, corpus, tokenizer)
    layout = packing.BinLayout(store.lengths, cfg.seq_len, cfg.shuffle_seed)
    if layout.rows_per_epoch == 0:
        raise DataError(f"no SFT sample fits in data.seq_len={cfg.seq_len} tokens")
    return _iterator(cfg, "sft", store, layout, tokenizer, mtp_depth, process_index, process_count, start_state,
                     copy=_copy_spans(cfg, tokenizer.vocab_size))


def make_eval_batches(cfg: DataConfig, tokenizer, mtp_depth: int, process_index: int, process_count: int,
                      *, corpus: Corpus | None = None) -> grain.MapDataset:
    """The validation split once, in order, as a finite (re-iterable, `len`-able) dataset of this
    host's batches. The last global batch is completed with padding rows (loss_mask 0) so every
    host gets the same number of batches; `eval_max_batches` > 0 caps the count."""
    pipeline.check_mtp_depth(mtp_depth)
    per_host = pipeline.per_host_batch(cfg, process_index, process_count)
    store = _store(cfg, tokenizer, corpus, split.VALIDATION)
    if store.num_tokens == 0:
        raise DataError("the validation split is empty: raise data.validation_fraction or use a larger corpus")
    layout = packing.StreamLayout(store.lengths, cfg.seq_len, seed=0, shuffle=False, keep_tail=True)
    global_batches = -(-layout.rows_per_epoch // cfg.global_batch_size)
    if cfg.eval_max_batches:
        global_batches = min(global_batches, cfg.eval_max_batches)
    rows = pipeline.RowBuilder(layout, store, tokenizer.special.pad)
    return pipeline.batched_rows(rows, per_host, process_index, process_count, mtp_depth,
                                 num_rows=global_batches * cfg.global_batch_size)


def _copy_spans(cfg: DataConfig, vocab_size: int) -> CopySpans | None:
    """The copy-row transform of `data.copy_rows` (None when 0); random sources draw from the
    non-special ids, the first `data.copy_random_ids` of them when set."""
    if cfg.copy_rows == 0:
        return None
    random_ids = None
    if cfg.copy_source in (CopySource.RANDOM, CopySource.RECALL):
        low = len(special_tokens.ALL_SPECIAL_TOKENS)
        random_ids = (low, min(vocab_size, low + cfg.copy_random_ids) if cfg.copy_random_ids else vocab_size)
    return CopySpans(cfg.copy_rows, cfg.shuffle_seed, random_ids=random_ids, source_tokens=cfg.copy_source_tokens,
                     recall=cfg.copy_source == CopySource.RECALL)


def _store(cfg: DataConfig, tokenizer, corpus: Corpus | None, name: str) -> TokenStore:
    corpus = corpus or build_or_load_corpus(cfg)
    return build_or_load_shards(cfg, corpus, tokenizer)[name]


def _iterator(cfg: DataConfig, kind: str, store: TokenStore, layout, tokenizer, mtp_depth: int, process_index: int,
              process_count: int, start_state: dict | None, copy: CopySpans | None = None) -> pipeline.DataIterator:
    pipeline.check_mtp_depth(mtp_depth)
    per_host = pipeline.per_host_batch(cfg, process_index, process_count)
    rows = pipeline.RowBuilder(layout, store, tokenizer.special.pad, copy)
    value_weight = cfg.sft_value_weight if kind == "sft" else 1.0
    batches = pipeline.batched_rows(rows, per_host, process_index, process_count, mtp_depth,
                                    value_weight=value_weight)
    meta = {"kind": kind, "data": store.fingerprint, "seq_len": cfg.seq_len, "mtp_depth": mtp_depth,
            "global_batch_size": cfg.global_batch_size, "shuffle_seed": cfg.shuffle_seed,
            "process_index": process_index, "process_count": process_count, "num_workers": cfg.num_workers}
    if copy is not None:  # only when used, so states saved before copy rows existed still load
        meta["copy_rows"], meta["copy_source"], meta["copy_ids"] = (
            copy.fraction, cfg.copy_source.value, list(copy.random_ids or ()))
        if copy.source_tokens:
            meta["copy_source_tokens"] = copy.source_tokens
    if value_weight != 1.0:  # only when used, so earlier states still load
        meta["value_weight"] = value_weight
    return pipeline.iterate(cfg, batches, meta, start_state)
