"""MinHash signatures and LSH near-duplicate removal.

A document is the set of its word shingles (`shingle_size` consecutive `\\w+` tokens). Its MinHash
signature is `[P] uint32`: for each of P hash functions h_p(x) = (a_p·x + b_p) >> 32 (multiply-add-
shift over 32-bit shingle hashes, a_p odd), the minimum over the document's shingles. The fraction
of equal entries between two signatures estimates their Jaccard similarity.

`near_duplicates` walks documents in priority order and drops a document when an already *kept* one
shares an LSH band bucket (bands × rows = P) and has estimated Jaccard >= threshold; comparing only
against kept documents avoids chaining (A~B, B~C does not drop C unless C~A). Deterministic: the
hash parameters come from a fixed seed and word hashes are CRC32 (not Python's salted `hash`).
"""

from __future__ import annotations

import re
import zlib

import numpy as np

_WORD = re.compile(rb"\w+")
_PARAM_SEED = 20240917
_SHINGLE_MULTIPLIERS = np.array(
    [0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93, 0xFF51AFD7ED558CCD,
     0xC4CEB9FE1A85EC53, 0x94D049BB133111EB, 0xBF58476D1CE4E5B9], dtype=np.uint64)


def hash_params(num_perm: int) -> tuple[np.ndarray, np.ndarray]:
    """`(a, b)`, each `[num_perm] uint64`, a odd: the fixed MinHash hash family."""
    rng = np.random.default_rng(_PARAM_SEED)
    a = rng.integers(1, 2**63, size=num_perm, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    b = rng.integers(0, 2**63, size=num_perm, dtype=np.uint64)
    return a, b


def shingle_hashes(data: bytes, shingle_size: int) -> np.ndarray:
    """`[S] uint64` distinct 32-bit hashes of the word shingles of `data` (at least one)."""
    words = np.fromiter((zlib.crc32(w) for w in _WORD.findall(data)), dtype=np.uint64)
    if words.size == 0:
        words = np.zeros(1, dtype=np.uint64)
    k = min(shingle_size, words.size)
    count = words.size - k + 1
    acc = np.zeros(count, dtype=np.uint64)
    for j in range(k):  # shingle = sum_j word[i+j] * m_j (mod 2^64), then folded to 32 bits
        acc += words[j:j + count] * _SHINGLE_MULTIPLIERS[j % len(_SHINGLE_MULTIPLIERS)]
    folded = (acc ^ (acc >> np.uint64(32))) & np.uint64(0xFFFFFFFF)
    return np.unique(folded)


def signature(data: bytes, shingle_size: int, a: np.ndarray, b: np.ndarray, chunk: int = 16) -> np.ndarray:
    """`[P] uint32` MinHash signature of `data` for the hash family `(a, b)`."""
    shingles = shingle_hashes(data, shingle_size)
    out = np.empty(a.size, dtype=np.uint32)
    for start in range(0, a.size, chunk):  # chunks bound the [S, chunk] temporary
        hashed = (shingles[:, None] * a[None, start:start + chunk] + b[None, start:start + chunk]) >> np.uint64(32)
        out[start:start + chunk] = hashed.min(axis=0).astype(np.uint32)
    return out


def near_duplicates(signatures: np.ndarray, bands: int, threshold: float) -> np.ndarray:
    """`[N] int64`: for each row of `signatures [N, P]` (priority order), the index of the kept
    document it near-duplicates, or -1 if it is kept itself."""
    n, p = signatures.shape
    rows = p // bands
    buckets: list[dict[bytes, list[int]]] = [{} for _ in range(bands)]
    dup_of = np.full(n, -1, dtype=np.int64)
    for i in range(n):
        sig = signatures[i]
        keys = [sig[k * rows:(k + 1) * rows].tobytes() for k in range(bands)]
        candidates = {j for k, key in enumerate(keys) for j in buckets[k].get(key, ())}
        best = -1
        for j in sorted(candidates):
            if np.mean(signatures[j] == sig) >= threshold:
                best = j
                break
        if best >= 0:
            dup_of[i] = best
            continue
        for k, key in enumerate(keys):
            buckets[k].setdefault(key, []).append(i)
    return dup_of
