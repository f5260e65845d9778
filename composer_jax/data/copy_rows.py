"""Copy rows: pretraining rows whose second part repeats spans of their first part.

A model that never saw a repeated span has no reason to learn to copy from its context (an
induction head): at CPU scale, ~1M tokens of code do not teach it, and an agent that cannot copy a
test id, a line number or an identifier from a tool result cannot act on code it never saw. A copy
row keeps the first `T - T // 2` tokens of an ordinary packed row as the source and fills the rest
with spans of the source, each `[min_span, max_span]` tokens long at a random start; the whole row
becomes one segment (positions 0..T-1) so that every copied span can attend to its original. With
`random_ids` = (low, high) the source is instead `T - T // 2` uniformly random ids in [low, high)
(`data.copy_source=random`): only the copy can be predicted, so only the copy carries loss, the
strongest induction signal. With `source_tokens` = n > 0 a copy row is instead a run of
independent segments, each n source tokens then spans of them (`[min(min_span, n // 4), min(max_span,
n // 2)]` long) up to 2n tokens, the last one filling the row: copies at a chosen distance, and
many of them per row (the copy curriculum of `benchmarks/copy_formation.py`, inside SFT batches).
With `recall` each segment is instead a `recall_rows.recall_segment` of 2n random ids (records,
then queries by key; loss on the queries' suffix, separator and values).

Glossary: T = seq_len. Row arrays as `packing.assemble_row` returns them, each `[T]`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from composer_jax.data.errors import DataError
from composer_jax.data.recall_rows import IGNORED, recall_segment


@dataclasses.dataclass(frozen=True)
class CopySpans:
    """Which rows become copy rows (`fraction`, chosen per global row index) and their span lengths."""

    fraction: float
    seed: int
    min_span: int = 16
    max_span: int = 128
    random_ids: tuple[int, int] | None = None   # [low, high): random sources (no special ids)
    source_tokens: int = 0   # > 0: segments of this many source tokens each (0 = one source: half the row)
    recall: bool = False     # segments are recall segments (needs random_ids and source_tokens)

    def __post_init__(self) -> None:
        if not 0.0 <= self.fraction <= 1.0:
            raise DataError(f"copy row fraction {self.fraction!r}: must be in [0, 1]")
        if not 1 <= self.min_span <= self.max_span:
            raise DataError(f"copy spans [{self.min_span}, {self.max_span}]: need 1 <= min_span <= max_span")
        if self.source_tokens < 0:
            raise DataError(f"copy source of {self.source_tokens} tokens: must be >= 0 (0 = half the row)")
        if self.recall and (self.random_ids is None or not self.source_tokens):
            raise DataError("recall rows draw random ids in segments: need random_ids and source_tokens > 0")

    def __call__(self, index: int, row: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Row `index` as a copy row (chosen with probability `fraction`), else `row` unchanged.
        The source is the row's first `T - T // 2` real tokens (padding dropped) or random ids; a
        source shorter than `min_span` leaves the row unchanged. With `source_tokens`: `_segments`."""
        rng = np.random.default_rng((self.seed, 0xC0B1, index))
        if rng.random() >= self.fraction:
            return row
        if self.source_tokens:
            return self._segments(rng, row)
        tokens = row["tokens"]
        seq_len, half = len(tokens), len(tokens) - len(tokens) // 2
        if self.random_ids is None:
            source = tokens[:half][row["segment_ids"][:half] > 0]
        else:
            source = rng.integers(*self.random_ids, half).astype(tokens.dtype)
        if len(source) < self.min_span:
            return row
        trainable = np.ones(seq_len, dtype=row["trainable"].dtype)
        if self.random_ids is not None:
            trainable[:half] = 0   # random ids cannot be predicted: no loss on them
        return {"tokens": source_then_spans(source, seq_len, rng, self.min_span, self.max_span),
                "segment_ids": np.ones(seq_len, dtype=row["segment_ids"].dtype),
                "positions": np.arange(seq_len, dtype=row["positions"].dtype), "trainable": trainable}

    def _segments(self, rng: np.random.Generator, row: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The row as segments of `source_tokens` n source tokens then spans of them (2n tokens
        each, the last one to the row's end); code sources are consecutive n-token pieces of the
        row's real tokens (fewer segments when it has fewer), random sources fresh ids per segment."""
        tokens, n = row["tokens"], self.source_tokens
        seq_len = len(tokens)
        count = max(1, seq_len // (2 * n))
        if self.random_ids is None:
            real = tokens[row["segment_ids"] > 0]
            count = min(count, len(real) // n)
            if count == 0:
                return row
        min_span, max_span = min(self.min_span, max(1, n // 4)), min(self.max_span, max(1, n // 2))
        out = {"tokens": np.empty_like(tokens), "segment_ids": np.empty_like(row["segment_ids"]),
               "positions": np.empty_like(row["positions"]), "trainable": np.ones_like(row["trainable"])}
        for k in range(count):
            start, end = 2 * n * k, (2 * n * (k + 1) if k < count - 1 else seq_len)
            out["segment_ids"][start:end] = k + 1
            out["positions"][start:end] = np.arange(end - start)
            if self.recall:
                ids, kinds = recall_segment(rng, end - start, self.random_ids)
                out["tokens"][start:end], out["trainable"][start:end] = ids, kinds != IGNORED
                continue
            source = (real[n * k:n * (k + 1)] if self.random_ids is None
                      else rng.integers(*self.random_ids, n).astype(tokens.dtype))
            out["tokens"][start:end] = source_then_spans(source, end - start, rng, min_span, max_span)
            if self.random_ids is not None:
                out["trainable"][start:start + n] = 0
        return out


def source_then_spans(source: np.ndarray, seq_len: int, rng: np.random.Generator, min_span: int,
                      max_span: int) -> np.ndarray:
    """`[seq_len]` ids: `source`, then spans of it (each `[min_span, max_span]` long, capped at
    the source's length, at a uniformly random start) until `seq_len` is filled."""
    out = np.empty(seq_len, dtype=source.dtype)
    out[:len(source)] = source
    filled = len(source)
    longest = min(max_span, len(source))
    while filled < seq_len:
        length = int(rng.integers(min(min_span, longest), longest + 1))
        start = int(rng.integers(0, len(source) - length + 1))
        take = min(length, seq_len - filled)
        out[filled:filled + take] = source[start:start + take]
        filled += take
    return out
