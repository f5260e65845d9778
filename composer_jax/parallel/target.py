"""The platform a program is built for: the running backend, or the TPU an AOT compile targets.

Code that picks a platform-specific path (CPU fast paths, the padded ragged all-to-all emulation,
the quantized dots' kernel variant) asks `platform()` instead of `jax.default_backend()`, so a
program traced on this CPU machine for a TPU slice (`composer_jax.parallel.aot`) takes the TPU
paths. `compiling_for("tpu")` sets it for the duration of a trace; nothing else changes it.
"""
from __future__ import annotations

import contextlib
import threading

import jax

_state = threading.local()


def platform() -> str:
    """'tpu' inside `compiling_for("tpu")`, otherwise `jax.default_backend()`."""
    return getattr(_state, "platform", None) or jax.default_backend()


@contextlib.contextmanager
def compiling_for(name: str):
    """Trace programs for platform `name` ('tpu') inside this block (this thread only)."""
    prev = getattr(_state, "platform", None)
    _state.platform = name
    try:
        yield
    finally:
        _state.platform = prev
