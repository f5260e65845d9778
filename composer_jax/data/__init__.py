"""Data for continued pretraining and SFT: local code corpus, tokenizer, packed grain pipeline.

Nothing heavy is imported here; the public names below load their module on first use.

    build_or_load_corpus(cfg: DataConfig) -> Corpus
        Python sources of every installed CPython stdlib + pure-Python site-packages, filtered,
        exact- and near-deduplicated, held-out modules removed, split train/validation by path hash;
        cached under `<cache>/corpus/<fingerprint>` and rebuilt only when inputs/settings change.
        Corpus: .directory, .fingerprint, .stats, .built_now, num_docs(split), text(split, i),
        iter_texts(split), manifest().
    build_or_load_tokenizer(cfg, corpus, model_vocab_size: int | None = None) -> Tokenizer
        cfg.tokenizer_path (tokenizer.json or tiktoken BPE file) or a byte-level BPE trained on the
        corpus (cached). Tokenizer: encode(text), encode_batch(texts), decode(ids), vocab_size,
        special (.pad/.bos/.eos/.by_token[str]), token_to_id(str), save(path), fingerprint.
    check_vocab(tokenizer, model_vocab_size)  -> ConfigError on mismatch
    make_train_iterator(cfg, tokenizer, mtp_depth, process_index, process_count, start_state=None,
                        *, corpus=None) -> DataIterator   (infinite; get_state() / set_state(state))
    make_sft_iterator(same signature) -> DataIterator     (loss only on assistant tokens)
    make_eval_batches(cfg, tokenizer, mtp_depth, process_index, process_count, *, corpus=None)
        -> grain.MapDataset   (finite, len(), iterate with `for batch in ...`)

Batch: tokens/positions/segment_ids/targets [B,T] int32, loss_mask [B,T] float32,
mtp_targets [B,Dm,T] int32, mtp_mask [B,Dm,T] float32 (B per host, Dm = mtp_depth).
Special-token strings: `composer_jax.data.special_tokens`. Config: `composer_jax.data.config.DataConfig`.
"""

import importlib

_EXPORTS = {
    "DataConfig": "composer_jax.data.config",
    "Corpus": "composer_jax.data.corpus",
    "build_or_load_corpus": "composer_jax.data.corpus",
    "Tokenizer": "composer_jax.data.tokenizer",
    "build_or_load_tokenizer": "composer_jax.data.tokenizer",
    "load_tokenizer": "composer_jax.data.tokenizer",
    "check_vocab": "composer_jax.data.tokenizer",
    "DataIterator": "composer_jax.data.pipeline",
    "make_train_iterator": "composer_jax.data.loaders",
    "make_sft_iterator": "composer_jax.data.loaders",
    "make_eval_batches": "composer_jax.data.loaders",
    "DataError": "composer_jax.data.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'composer_jax.data' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
