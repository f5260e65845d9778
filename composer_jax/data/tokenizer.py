"""The tokenizer: a byte-level BPE (Hugging Face `tokenizers`) with the protocol's special tokens.

- `train_tokenizer(texts, vocab_size, pattern)`: byte-level BPE whose ids 0..16 are
  `special_tokens.ALL_SPECIAL_TOKENS` (PAD = 0), then the 256 byte symbols, then merges; topped up
  with `<|reserved_i|>` tokens so `vocab_size` is exact.
- `load_tokenizer(path, pattern)`: a `tokenizer.json`, or a tiktoken-style BPE file (Kimi's
  `tiktoken.model`; `pattern` is its pre-tokenizer regex). Special tokens it lacks are appended.
- `build_or_load_tokenizer(cfg, corpus, model_vocab_size=None)`: the configured one (cached when
  trained), checked against the model's vocabulary size when given.
- `check_vocab(tokenizer, model_vocab_size)`: a clear error when they do not match.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import tokenizers
from tokenizers import Regex, decoders, models, pre_tokenizers, trainers

from composer_jax.data import special_tokens as st, tiktoken_file
from composer_jax.data.cache import build_once, stable_hash
from composer_jax.data.config import DataConfig, SplitPattern, resolved_cache_dir
from composer_jax.data.errors import DataError
from composer_jax.errors import ConfigError

TOKENIZER_FILE = "tokenizer.json"
# A model's embedding may have up to this many rows beyond the tokenizer's vocabulary (models round
# vocabularies up, e.g. Kimi K2: 163,584 BPE ranks + 256 reserved specials = 163,840 rows).
VOCAB_PAD_SLACK = 1024

SPLIT_PATTERNS: dict[SplitPattern, str] = {
    SplitPattern.KIMI: "|".join([  # Kimi K2 `tokenization_kimi.py` pat_str
        r"[\p{Han}]+",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]),
    SplitPattern.CL100K: r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                         r"|\s*[\r\n]+|\s+(?!\S)|\s+",
}


@dataclasses.dataclass(frozen=True)
class SpecialIds:
    """Ids of the special tokens, by the constant names of `special_tokens`."""

    pad: int
    bos: int
    eos: int
    by_token: dict[str, int]


class Tokenizer:
    """A `tokenizers.Tokenizer` with composer_jax's special tokens guaranteed atomic.

    encode(text) -> list[int]; encode_offsets(text) -> (ids, spans); encode_batch(texts) -> list[list[int]]; decode(ids) -> str;
    vocab_size (embedding rows needed); special (SpecialIds); save(path); fingerprint.
    """

    def __init__(self, hf: tokenizers.Tokenizer, source: str):
        missing = [t for t in st.ALL_SPECIAL_TOKENS if hf.token_to_id(t) is None]
        if missing:
            hf.add_special_tokens(missing)
        else:  # present as ordinary vocab entries: make sure they are matched atomically
            hf.add_special_tokens(list(st.ALL_SPECIAL_TOKENS))
        self.hf = hf
        self.source = source
        by_token = {t: hf.token_to_id(t) for t in st.ALL_SPECIAL_TOKENS}
        self.special = SpecialIds(by_token[st.PAD], by_token[st.BOS], by_token[st.EOS], by_token)
        self.fingerprint = hashlib.sha256(hf.to_str().encode("utf-8")).hexdigest()[:16]

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids

    def encode_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """`(ids, offsets)`: offsets[i] = (start, end) character span of `text` that token i covers."""
        encoding = self.hf.encode(text, add_special_tokens=False)
        return list(encoding.ids), [tuple(o) for o in encoding.offsets]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.hf.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.hf.token_to_id(token)

    def save(self, path: str | os.PathLike) -> Path:
        """Write `tokenizer.json` (into `path` if it is a directory); returns the file written."""
        path = Path(path)
        if path.is_dir():
            path = path / TOKENIZER_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        self.hf.save(str(path))
        return path


def train_tokenizer(texts: Iterable[str], vocab_size: int, pattern: SplitPattern, progress: bool = False) -> Tokenizer:
    """Train a byte-level BPE of exactly `vocab_size` ids (specials first, reserved fillers last)."""
    minimum = len(st.ALL_SPECIAL_TOKENS) + 256 + 1
    if vocab_size < minimum:
        raise ConfigError(f"data.vocab_size={vocab_size}: must be >= {minimum} (special tokens + 256 bytes + 1)")
    hf = tokenizers.Tokenizer(models.BPE())
    hf.pre_tokenizer = _pre_tokenizer(pattern)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(st.ALL_SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=2,
                                  show_progress=progress)
    hf.train_from_iterator(texts, trainer)
    have = hf.get_vocab_size(with_added_tokens=True)
    if have < vocab_size:
        hf.add_special_tokens([st.reserved_token(i) for i in range(vocab_size - have)])
    return Tokenizer(hf, source=f"trained:bpe-{vocab_size}")


def load_tokenizer(path: str | os.PathLike, pattern: SplitPattern = SplitPattern.KIMI) -> Tokenizer:
    """Load a `tokenizer.json` or a tiktoken BPE file (format detected from the content)."""
    path = Path(os.path.expanduser(str(path)))
    try:
        head = path.read_bytes()[:1].strip() or b"?"
    except OSError as e:
        raise DataError(f"cannot read tokenizer file {path}: {e}") from e
    if head == b"{":
        try:
            hf = tokenizers.Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception on malformed JSON
            raise DataError(f"{path} is not a valid tokenizer.json: {e}") from e
        return Tokenizer(hf, source=str(path))
    ranks = tiktoken_file.read_ranks(path)
    return Tokenizer(tiktoken_file.tokenizer_from_ranks(ranks, SPLIT_PATTERNS[pattern]), source=str(path))


def check_vocab(tokenizer: Tokenizer, model_vocab_size: int) -> None:
    """ConfigError unless tokenizer.vocab_size <= model_vocab_size < tokenizer.vocab_size + slack."""
    have = tokenizer.vocab_size
    if not have <= model_vocab_size < have + VOCAB_PAD_SLACK:
        raise ConfigError(
            f"tokenizer {tokenizer.source} has {have} tokens but the model's vocab_size is {model_vocab_size}: "
            f"the model needs between {have} and {have + VOCAB_PAD_SLACK - 1} embedding rows. Set the model's "
            f"vocab_size (and data.vocab_size when training a tokenizer) to {have}, or use the tokenizer file "
            "that belongs to the checkpoint.")


def build_or_load_tokenizer(cfg: DataConfig, corpus, model_vocab_size: int | None = None) -> Tokenizer:
    """`cfg.tokenizer_path` loaded, or a BPE trained on the corpus's train split (cached by corpus
    fingerprint and settings). Checked against `model_vocab_size` when given."""
    if cfg.tokenizer_path:
        tokenizer = load_tokenizer(cfg.tokenizer_path, cfg.split_pattern)
    else:
        key = stable_hash({"corpus": corpus.fingerprint, "vocab": cfg.vocab_size, "pattern": cfg.split_pattern.value,
                           "train_bytes": cfg.tokenizer_train_bytes, "special": st.ALL_SPECIAL_TOKENS, "v": 1})

        def build(out: Path) -> None:
            trained = train_tokenizer(_limited_texts(corpus, cfg.tokenizer_train_bytes), cfg.vocab_size,
                                      cfg.split_pattern, cfg.progress)
            trained.save(out / TOKENIZER_FILE)
            (out / "info.json").write_text(json.dumps({"corpus": corpus.fingerprint, "vocab_size": cfg.vocab_size}))

        directory, _ = build_once(resolved_cache_dir(cfg), "tokenizer", key, build)
        tokenizer = load_tokenizer(directory / TOKENIZER_FILE)
        tokenizer.source = f"trained:{directory / TOKENIZER_FILE}"
    if model_vocab_size is not None:
        check_vocab(tokenizer, model_vocab_size)
    return tokenizer


def _pre_tokenizer(pattern: SplitPattern) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERNS[pattern]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


def _limited_texts(corpus, max_bytes: int) -> Iterable[str]:
    total = 0
    for text in corpus.iter_texts("train"):
        if total >= max_bytes:
            return
        total += len(text)
        yield text
