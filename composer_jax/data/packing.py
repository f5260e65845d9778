"""Packing documents into fixed-length rows of T tokens (pure numpy, random access by row index).

Two layouts, both deterministic functions of (seed, epoch, row):

- `StreamLayout` (pretraining, evaluation): the epoch's documents (shuffled per epoch, or in order)
  are laid back to back in one stream; row r is stream[r·T : (r+1)·T]. A document cut by a row
  boundary continues as a new segment in the next row. No padding except after the stream's end.
- `BinLayout` (SFT): whole samples (length <= T) are packed once into rows by best-fit decreasing;
  each epoch visits the rows in a fresh random order. Samples are never cut; rows end in padding.

`assemble_row` turns a row's pieces into arrays (glossary, all `[T]`):
  tokens       int32  ids; `pad_id` on padding
  segment_ids  int32  0 = padding, 1, 2, ... for the pieces in the row, in order
  positions    int32  0, 1, ... restarting at every piece (a cut document restarts at 0 too: the
                      row cannot attend to the previous row anyway)
  trainable    uint8  1 where a *target* on this token may carry loss (all 1 for pretraining)
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence

import numpy as np

from composer_jax.data.shards import TokenStore

# A piece: (doc id, offset inside the doc, offset inside the row, length).
Piece = tuple[int, int, int, int]


def epoch_permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """`[n] int64`, a permutation fixed by (seed, epoch)."""
    return np.random.default_rng([seed, epoch]).permutation(n)


class EpochCache:
    """Thread-safe memo of per-epoch arrays (the last two epochs), picklable for grain workers."""

    def __init__(self, compute):
        self._compute = compute
        self._cache: dict = {}
        self._lock = threading.Lock()

    def __call__(self, epoch: int):
        with self._lock:
            if epoch not in self._cache:
                if len(self._cache) >= 2:
                    self._cache.pop(min(self._cache))
                self._cache[epoch] = self._compute(epoch)
            return self._cache[epoch]

    def __getstate__(self) -> dict:
        return {"_compute": self._compute}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["_compute"])


class StreamLayout:
    """Documents back to back; `rows_per_epoch` = floor(total / T) (`keep_tail`: ceil, last padded)."""

    def __init__(self, lengths: np.ndarray, seq_len: int, seed: int, shuffle: bool, keep_tail: bool = False):
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.seq_len, self.seed, self.shuffle = seq_len, seed, shuffle
        total = int(self.lengths.sum())
        self.rows_per_epoch = -(-total // seq_len) if keep_tail else total // seq_len
        self._epoch = EpochCache(self._layout)

    def _layout(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(order, starts, ends) of the epoch's documents in the stream, each `[N] int64`."""
        order = epoch_permutation(self.seed, epoch, len(self.lengths)) if self.shuffle else np.arange(len(self.lengths))
        ends = np.cumsum(self.lengths[order])
        return order, ends - self.lengths[order], ends

    def pieces(self, epoch: int, row: int) -> list[Piece]:
        order, starts, ends = self._epoch(epoch)
        lo, hi = row * self.seq_len, (row + 1) * self.seq_len
        first = int(np.searchsorted(ends, lo, side="right"))
        last = int(np.searchsorted(starts, hi, side="left"))
        out = []
        for j in range(first, last):
            a, b = max(lo, int(starts[j])), min(hi, int(ends[j]))
            if b > a:
                out.append((int(order[j]), a - int(starts[j]), a - lo, b - a))
        return out


class BinLayout:
    """Whole samples packed into rows once (best-fit decreasing); rows shuffled per epoch.
    Samples longer than T are left out (`dropped` counts them)."""

    def __init__(self, lengths: np.ndarray, seq_len: int, seed: int, shuffle: bool = True):
        self.seq_len, self.seed, self.shuffle = seq_len, seed, shuffle
        lengths = np.asarray(lengths, dtype=np.int64)
        fits = np.flatnonzero((lengths > 0) & (lengths <= seq_len))
        self.dropped = int(len(lengths) - len(fits))
        self.bins = best_fit_decreasing(lengths, fits, seq_len)
        self.rows_per_epoch = len(self.bins)
        self._lengths = lengths
        self._row_order = EpochCache(self._permutation)

    def _permutation(self, epoch: int) -> np.ndarray:
        return epoch_permutation(self.seed, epoch, len(self.bins))

    def pieces(self, epoch: int, row: int) -> list[Piece]:
        index = int(self._row_order(epoch)[row]) if self.shuffle else row
        out, offset = [], 0
        for doc in self.bins[index]:
            length = int(self._lengths[doc])
            out.append((doc, 0, offset, length))
            offset += length
        return out


def best_fit_decreasing(lengths: np.ndarray, items: np.ndarray, capacity: int) -> list[list[int]]:
    """Bins (lists of item ids, each in id order) with total length <= capacity."""
    order = sorted(items.tolist(), key=lambda i: (-int(lengths[i]), i))
    free: list[tuple[int, int]] = []  # sorted (remaining capacity, bin id)
    bins: list[list[int]] = []
    for item in order:
        size = int(lengths[item])
        k = bisect.bisect_left(free, (size, -1))
        if k == len(free):
            bins.append([item])
            bisect.insort(free, (capacity - size, len(bins) - 1))
        else:
            remaining, b = free.pop(k)
            bins[b].append(item)
            bisect.insort(free, (remaining - size, b))
    return [sorted(b) for b in bins]


def assemble_row(pieces: Sequence[Piece], store: TokenStore, seq_len: int, pad_id: int) -> dict[str, np.ndarray]:
    """The arrays of one packed row (see the module glossary)."""
    tokens = np.full(seq_len, pad_id, dtype=np.int32)
    segment_ids = np.zeros(seq_len, dtype=np.int32)
    positions = np.zeros(seq_len, dtype=np.int32)
    trainable = np.zeros(seq_len, dtype=np.uint8)
    for k, (doc, doc_offset, row_offset, length) in enumerate(pieces):
        dst = slice(row_offset, row_offset + length)
        tokens[dst] = store.doc(doc)[doc_offset:doc_offset + length]
        trainable[dst] = store.trainable(doc)[doc_offset:doc_offset + length]
        segment_ids[dst] = k + 1
        positions[dst] = np.arange(length, dtype=np.int32)
    return {"tokens": tokens, "segment_ids": segment_ids, "positions": positions, "trainable": trainable}
