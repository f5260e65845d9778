"""The ladder's train / held-out split: by top-level module, deterministic in a seed.

A module is held out when its top-level name (a stdlib module, or a whole package: its modules
share one test suite and one workspace, so they cannot be split apart) is in
`composer_jax.heldout.HELDOUT_MODULES` (also kept out of the pretraining corpus), or when a hash of
(seed, name) falls below `fraction`. The stdlib is pretraining text (`data/sources.py`) except
heldout.py's modules, so with `fraction` 0 (the default of `rl.task.heldout_fraction`) no held-out
module was seen in any training stage; a fraction above 0 holds out more modules, which the
pretrained model may have read (but SFT and RL never). Every level uses the same split, and every CPython version of
a module lands on the same side. Held-out tasks have `split == "eval"`: the SFT data
(`data/sft_env.py`) and the RL family's training tasks take only `split == "train"`.
"""
from __future__ import annotations

import hashlib

from composer_jax.heldout import HELDOUT_MODULES

TRAIN, HELDOUT = "train", "eval"


def top_level(module: str) -> str:
    """"simplejson.decoder" -> "simplejson"; "textwrap" -> "textwrap"."""
    return module.split(".", 1)[0]


def hash_fraction(seed: int, name: str) -> float:
    """A uniform number in [0, 1) fixed by (seed, name)."""
    digest = hashlib.sha256(f"ladder-split:{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2 ** 64


def is_heldout(module: str, seed: int, fraction: float) -> bool:
    """True if `module`'s tasks are held out (module docstring)."""
    top = top_level(module)
    return top in HELDOUT_MODULES or hash_fraction(seed, top) < fraction


def split_of(module: str, seed: int, fraction: float) -> str:
    """"eval" for a held-out module, else "train"."""
    return HELDOUT if is_heldout(module, seed, fraction) else TRAIN
