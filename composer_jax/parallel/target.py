"""The platform a program is built for: the running backend, or the TPU an AOT compile targets.

Code that picks a platform-specific path (CPU fast paths, the padded ragged all-to-all emulation,
the quantized dots' kernel variant) asks `platform()` instead of `jax.default_backend()`, so a
program traced on this CPU machine for a TPU slice (`composer_jax.parallel.aot`) takes the TPU
paths. `compiling_for("tpu")` sets it for the duration of a trace (this thread). The setting is a
JAX config state included in the trace context, so JAX's trace caches never hand a CPU trace to a
TPU compile or back.
"""
from __future__ import annotations

import contextlib

import jax
from jax._src import config as _jax_config    # no public API registers a trace-context state

_TARGET = _jax_config.optional_string_state(
    name="composer_jax_target_platform", default=None,
    help="composer_jax: the platform programs are traced for (None: the default backend)",
    include_in_trace_context=True)


def platform() -> str:
    """'tpu' inside `compiling_for("tpu")`, otherwise `jax.default_backend()`."""
    return _TARGET.value or jax.default_backend()


@contextlib.contextmanager
def compiling_for(name: str | None):
    """Trace programs for platform `name` ('tpu'; None: the default backend) inside this block."""
    with _TARGET(name):
        yield
