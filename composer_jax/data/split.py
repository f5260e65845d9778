"""Deterministic train/validation split by a hash of the module's path.

The key is `salt:kind:relpath` — the path relative to its library root, *without* the Python
version — so every version of a module (e.g. `asyncio/base_events.py` from 3.8 ... 3.13) lands in
the same split and validation never scores text whose sibling version was trained on.
"""

from __future__ import annotations

import hashlib

TRAIN = "train"
VALIDATION = "validation"
SPLITS = (TRAIN, VALIDATION)


def split_of(kind: str, relpath: str, validation_fraction: float, salt: str) -> str:
    """TRAIN or VALIDATION; a pure function of the arguments."""
    digest = hashlib.sha256(f"{salt}:{kind}:{relpath}".encode("utf-8")).digest()
    unit = int.from_bytes(digest[:8], "big") / 2.0**64
    return VALIDATION if unit < validation_fraction else TRAIN
