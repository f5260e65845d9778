"""Recall rows: look a value up by the key a few tokens before the token just written.

A copy row (`copy_rows.py`) teaches one-token induction: predict the token that followed the most
recent occurrence of the token just written. An agent's tool call needs a different lookup: after
`"file_path": "` or `"old_string": "` the last token (` "`) occurs everywhere, and the value to
write follows the *key* a few tokens back, not the most recent ` "` (which one-token induction
picks, benchmarks/results/rl_coding_ladder.txt section 20). A recall segment trains exactly that:

    store:   d_1 c.. s v_1.. f..  d_2 c.. s v_2.. f..  ...      (records, random filler between)
    queries: d_j c.. s v_j..  f..  d_k c.. s v_k..  ...          (loss on c.., s and v_j..)

Each record is a distinct key id `d_i`, the segment's shared key suffix `c..` (0..`max_suffix` ids,
the same in every record, as `_string` is shared by `old_string` and `new_string`; none by default:
the fixed gap of 2 that a grown 3-layer model learns, benchmarks/results/rl_coding_ladder.txt
section 21), the segment's separator `s`, then 1-4 value ids. Predicting `v_j[0]` at a query's `s`
needs the id `len(c) + 1` back; the most recent `s` is followed by another record's value. All ids
are random in `[low, high)`.

Glossary: S = the segment's length in tokens; kinds `[S]` int8 per token: IGNORED (no loss), KEY
(the query's suffix and separator), VALUE_FIRST (a value's first id, the lookup), VALUE_REST.
"""

from __future__ import annotations

import numpy as np

IGNORED, KEY, VALUE_FIRST, VALUE_REST = 0, 1, 2, 3


def recall_segment(rng: np.random.Generator, length: int, ids: tuple[int, int],
                   store_share: float = 0.5, max_suffix: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """`length` ids (the store in the first `store_share` of them, then queries of it) and their
    kinds, both `[length]`. Ids are drawn from `[ids[0], ids[1])`, which must hold at least 64;
    the key suffix has 0..`max_suffix` ids."""
    low, high = ids
    if high - low < 64:
        raise ValueError(f"recall rows need at least 64 ids to draw from, got [{low}, {high})")
    if length < 16:
        raise ValueError(f"a recall segment needs at least 16 tokens, got {length}")
    suffix = rng.integers(low, high, int(rng.integers(0, max_suffix + 1)))
    sep = int(rng.integers(low, high))
    store_len = max(8, int(length * store_share))
    tokens, kinds = [], []
    records: list[tuple[int, np.ndarray]] = []
    used = {sep, *suffix.tolist()}

    def emit(values, kind):
        tokens.extend(int(v) for v in values)
        kinds.extend([kind] * len(values))

    while len(tokens) < store_len:
        key = int(rng.integers(low, high))
        while key in used:
            key = int(rng.integers(low, high))
        used.add(key)
        value = rng.integers(low, high, int(rng.integers(1, 5)))
        records.append((key, value))
        emit([key, *suffix, sep, *value], IGNORED)
        emit(rng.integers(low, high, int(rng.integers(0, 4))), IGNORED)
    while len(tokens) < length:
        key, value = records[int(rng.integers(0, len(records)))]
        emit([key], IGNORED)
        emit([*suffix, sep], KEY)
        emit(value[:1], VALUE_FIRST)
        emit(value[1:], VALUE_REST)
        emit(rng.integers(low, high, int(rng.integers(0, 4))), IGNORED)
    return (np.asarray(tokens[:length], dtype=np.int32), np.asarray(kinds[:length], dtype=np.int8))
