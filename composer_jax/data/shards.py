"""Tokenized documents as memory-mapped arrays: one token shard per split.

On disk (`<cache>/tokens/<key>/`): `<split>.tokens.bin` (all documents' ids back to back, uint16
when the vocabulary fits, else uint32), `<split>.offsets.npy` (`[N+1] int64`), optionally
`<split>.trainable.bin` (`uint8`, 1 = the loss may fall on this token; SFT), and `info.json`.
Each CPT document is `BOS + encode(text) + EOS` (when `add_bos_eos`). The key hashes the corpus
fingerprint, the tokenizer fingerprint and the settings, so shards are rebuilt exactly when needed.

`TokenStore` opens the memmaps lazily and drops them when pickled, so grain worker processes
re-open the files instead of receiving copies.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from composer_jax.data import split
from composer_jax.data.cache import build_once, stable_hash
from composer_jax.data.config import DataConfig, resolved_cache_dir

_ENCODE_CHUNK = 256


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.uint32)


class TokenStore:
    """Read-only documents of token ids. `lengths [N] int64`; `doc(i) -> [L] tokens`;
    `trainable(i) -> [L] uint8` (all ones when the store has no trainable mask)."""

    def __init__(self, directory: str | os.PathLike, name: str):
        self.directory = str(directory)
        self.name = name
        info = json.loads((Path(directory) / "info.json").read_text())
        self.dtype = np.dtype(info["dtype"])
        self.fingerprint = f"{info['key']}:{name}"
        self.offsets = np.load(Path(directory) / f"{name}.offsets.npy")
        self.lengths = np.diff(self.offsets)
        self.has_trainable = (Path(directory) / f"{name}.trainable.bin").is_file()
        self._tokens: np.ndarray | None = None
        self._trainable: np.ndarray | None = None

    @property
    def num_docs(self) -> int:
        return len(self.lengths)

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    def doc(self, index: int) -> np.ndarray:
        if self._tokens is None:
            self._tokens = _open(Path(self.directory) / f"{self.name}.tokens.bin", self.dtype, self.num_tokens)
        return self._tokens[self.offsets[index]:self.offsets[index + 1]]

    def trainable(self, index: int) -> np.ndarray:
        if not self.has_trainable:
            return np.ones(int(self.lengths[index]), dtype=np.uint8)
        if self._trainable is None:
            self._trainable = _open(Path(self.directory) / f"{self.name}.trainable.bin", np.dtype(np.uint8),
                                    self.num_tokens)
        return self._trainable[self.offsets[index]:self.offsets[index + 1]]

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_tokens"] = state["_trainable"] = None
        return state


def write_store(directory: Path, name: str, docs: Iterable[tuple[Sequence[int], Sequence[int] | None]],
                dtype: np.dtype) -> None:
    """Write documents `(ids, trainable-or-None)` as split `name` into `directory`."""
    offsets = [0]
    with_mask = None
    with open(directory / f"{name}.tokens.bin", "wb") as tok_f, \
            open(directory / f"{name}.trainable.bin", "wb") as mask_f:
        for ids, mask in docs:
            tok_f.write(np.asarray(ids, dtype=dtype).tobytes())
            with_mask = with_mask if with_mask is not None else mask is not None
            if with_mask:
                mask_f.write(np.asarray(mask, dtype=np.uint8).tobytes())
            offsets.append(offsets[-1] + len(ids))
    if not with_mask:
        os.remove(directory / f"{name}.trainable.bin")
    np.save(directory / f"{name}.offsets.npy", np.asarray(offsets, dtype=np.int64))


def build_or_load_shards(cfg: DataConfig, corpus, tokenizer) -> dict[str, TokenStore]:
    """`{"train": TokenStore, "validation": TokenStore}` for the corpus under the tokenizer."""
    key = stable_hash({"corpus": corpus.fingerprint, "tokenizer": tokenizer.fingerprint,
                       "bos_eos": cfg.add_bos_eos, "v": 1})
    dtype = token_dtype(tokenizer.vocab_size)

    def build(out: Path) -> None:
        for name in split.SPLITS:
            bar = tqdm(total=corpus.num_docs(name), desc=f"tokenize {name}", unit="doc",
                       disable=not cfg.progress, leave=False)
            with bar:
                write_store(out, name, _encoded_docs(corpus.iter_texts(name), tokenizer, cfg.add_bos_eos, bar), dtype)
        (out / "info.json").write_text(json.dumps({"dtype": dtype.name, "key": key, "corpus": corpus.fingerprint,
                                                   "tokenizer": tokenizer.fingerprint}))

    directory, _ = build_once(resolved_cache_dir(cfg), "tokens", key, build)
    return {name: TokenStore(directory, name) for name in split.SPLITS}


def _encoded_docs(texts: Iterable[str], tokenizer, add_bos_eos: bool, bar: tqdm):
    bos, eos = ([tokenizer.special.bos], [tokenizer.special.eos]) if add_bos_eos else ([], [])
    chunk: list[str] = []
    for text in texts:
        chunk.append(text)
        if len(chunk) == _ENCODE_CHUNK:
            yield from ((bos + ids + eos, None) for ids in tokenizer.encode_batch(chunk))
            bar.update(len(chunk))
            chunk = []
    if chunk:
        yield from ((bos + ids + eos, None) for ids in tokenizer.encode_batch(chunk))
        bar.update(len(chunk))


def _open(path: Path, dtype: np.dtype, count: int) -> np.ndarray:
    if count == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(count,))
