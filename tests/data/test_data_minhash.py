"""MinHash estimates and LSH near-duplicate selection."""

from __future__ import annotations

import numpy as np
from data_helpers import module_source

from composer_jax.data import minhash


def _jaccard(a: bytes, b: bytes, k: int) -> float:
    sa, sb = set(minhash.shingle_hashes(a, k).tolist()), set(minhash.shingle_hashes(b, k).tolist())
    return len(sa & sb) / len(sa | sb)


def test_signature_estimates_jaccard():
    a_, b_ = minhash.hash_params(256)
    base = module_source(1, lines=80).encode()
    edited = base.replace(b"factor=15", b"factor=99").replace(b"factor=23", b"factor=98")
    for other in (edited, module_source(2, lines=80).encode(), base):
        true = _jaccard(base, other, 5)
        estimate = float(np.mean(minhash.signature(base, 5, a_, b_) == minhash.signature(other, 5, a_, b_)))
        assert abs(true - estimate) < 0.1


def test_near_duplicates_keep_the_first_copy():
    a_, b_ = minhash.hash_params(128)
    docs = [module_source(i, lines=60).encode() for i in range(4)]
    near = docs[0].replace(b"item_3,", b"item_99,", 1)
    sigs = np.stack([minhash.signature(d, 5, a_, b_) for d in docs + [near]])
    np.testing.assert_array_equal(minhash.near_duplicates(sigs, 16, 0.8), [-1, -1, -1, -1, 0])
    # identical signatures with a threshold of 1.0 are still duplicates; different ones are not
    np.testing.assert_array_equal(minhash.near_duplicates(sigs[[0, 0, 1]], 16, 1.0), [-1, 0, -1])
