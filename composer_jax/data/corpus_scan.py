"""Per-file work of the corpus build, run in worker processes (module-level functions so they
can pickle them): read + hash + cheap filters, then Python-3 parse check + MinHash signature.

`parallel_map` runs a function over items with a process pool (or inline for small inputs), in
input order, with a tqdm bar.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from composer_jax.data import filters, minhash

_INLINE_BELOW = 1500  # fewer items than this: no pool (start-up would cost more than it saves)
# fork: no `if __name__ == "__main__"` guard needed in callers, fast start; the workers only read
# files and run numpy/ast, never JAX, so forking a process that has imported JAX is safe here.
_START_METHOD = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


def scan_file(args: tuple[str, filters.FilterSettings]) -> tuple[str, str | None]:
    """`(sha256 hex, reject reason or None)` of one file; unreadable files get reason "unreadable"."""
    path, settings = args
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return "", "unreadable"
    return hashlib.sha256(data).hexdigest(), filters.reject_reason(data, settings, path)


def analyze_file(args: tuple[str, bool, int, int]) -> np.ndarray | None:
    """MinHash signature `[P] uint32` of a file, or None if it must parse as Python 3 and does not."""
    path, require_py3, shingle_size, num_perm = args
    with open(path, "rb") as f:
        data = f.read()
    if require_py3 and not filters.parses_as_python3(data):
        return None
    a, b = minhash.hash_params(num_perm)
    return minhash.signature(data, shingle_size, a, b)


def parallel_map(fn: Callable[[Any], Any], items: Sequence[Any], workers: int, desc: str,
                 progress: bool) -> list[Any]:
    """`[fn(x) for x in items]`, in order, over `workers` spawned processes when worthwhile."""
    workers = workers or os.cpu_count() or 1
    bar = tqdm(total=len(items), desc=desc, disable=not progress, unit="item", leave=False)
    results = []
    with bar:
        if workers <= 1 or len(items) < _INLINE_BELOW:
            for item in items:
                results.append(fn(item))
                bar.update()
        else:
            with multiprocessing.get_context(_START_METHOD).Pool(workers) as pool:
                for result in pool.imap(fn, items, chunksize=32):
                    results.append(result)
                    bar.update()
    return results
