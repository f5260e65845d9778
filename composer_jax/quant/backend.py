"""GEMMs on QArrays through either backend: "jnp" (dequantize, one float32 dot; the default on
CPU) or "pallas" (the block-scaled kernels in pallas_kernels, variant chosen by the platform:
"tpu" on TPU; on GPU "blackwell" (native block-scaled tcgen05 MMA) on compute capability 10.x
once a one-time on-device check of it against the reference passed, else "hopper"; the
interpret-mode "portable" kernel on CPU). "auto" picks jnp on CPU and pallas elsewhere.

Glossary: M rows, K contraction, N columns, G groups.
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
from jax import lax

import pallas_kernels
from composer_jax.errors import ConfigError
from composer_jax.parallel import target
from composer_jax.quant.grouped import grouped_matmul
from composer_jax.quant import blockwise
from composer_jax.quant.qarray import QArray
from composer_jax.quant.quantize import dequantize, quantize

BACKENDS = ("auto", "jnp", "pallas")
_HIGHEST = lax.Precision.HIGHEST


def resolve(backend: str) -> str:
    """"jnp" or "pallas" for a requested backend name."""
    if backend not in BACKENDS:
        raise ConfigError(f"unknown quantized-dot backend {backend!r}; valid: {BACKENDS}")
    if backend == "auto":
        return "jnp" if target.platform() == "cpu" else "pallas"
    return backend


def kernel_variant() -> str:
    """The pallas_kernels variant for the default device."""
    platform = target.platform()
    if platform == "tpu":
        return "tpu"
    if platform == "cpu":
        return "portable"
    return "blackwell" if _tcgen05_gpu() and _blackwell_self_check() else "hopper"


def _interpret() -> bool:
    """Pallas interpret mode on CPU; compiled kernels for a GPU or a TPU (also an AOT target)."""
    return target.platform() == "cpu"


def _tcgen05_gpu() -> bool:
    cc = str(getattr(jax.devices()[0], "compute_capability", ""))
    return cc.split(".")[0] in ("10", "11")


@functools.cache
def _blackwell_self_check() -> bool:
    """Run the blackwell matmul once per process on a small MXFP8 and NVFP4 problem and compare it
    with the reference (blockwise); on an error or a mismatch warn and fall back to "hopper", so an
    unvalidated native kernel never silently changes training numerics."""
    try:
        with jax.ensure_compile_time_eval():
            a = jax.random.normal(jax.random.PRNGKey(0), (192, 512))
            b = jax.random.normal(jax.random.PRNGKey(1), (512, 160))
            for fmt in ("mxfp8", "nvfp4"):
                qa, qb = quantize(a, fmt, axis=1), quantize(b, fmt, axis=0)
                want = blockwise.block_scaled_matmul(qa, qb)
                got = pallas_kernels.block_scaled_matmul(
                    _kernel_data(qa), _kernel_scales(qa, False), _kernel_data(qb), _kernel_scales(qb, True),
                    blockwise.global_product(qa, qb), block_size=qa.block_size, scale_kind=_scale_kind(qa),
                    variant="blackwell")
                err = float(jnp.max(jnp.abs(got - want)) / jnp.max(jnp.abs(want)))
                if not err < 1e-5:
                    raise ValueError(f"{fmt} max relative error {err:.3g} against the reference")
    except Exception as e:  # noqa: BLE001 - any failure means: do not use the kernel
        warnings.warn(f"blackwell block-scaled kernel failed its self-check ({e}); using the hopper variant")
        return False
    return True


def _scale_kind(q: QArray) -> str:
    return "e8m0" if q.fmt == "mxfp8" else "e4m3"


def _kernel_scales(q: QArray, rhs: bool) -> jax.Array:
    """Scales as the kernels take them: E8M0 bytes (uint8) or E4M3; 2-D tiles repeated along N."""
    s = q.scales
    if q.fmt == "mxfp8":
        s = lax.bitcast_convert_type(s, jnp.uint8)
    if rhs and q.is_2d:
        s = jnp.repeat(s, q.block_size, axis=-1)
    return s


def _kernel_data(q: QArray) -> jax.Array:
    """Element values as float8_e4m3fn (E2M1 values convert exactly)."""
    return q.data.astype(jnp.float8_e4m3fn)


def matmul(qa: QArray, qb: QArray, backend: str) -> jax.Array:
    """qa [M, K] (blocked along K) @ qb [K, N] (blocked along K or 2-D tiles) -> float32 [M, N]."""
    if resolve(backend) == "jnp":
        return jnp.dot(dequantize(qa), dequantize(qb), precision=_HIGHEST, preferred_element_type=jnp.float32)
    blockwise.rhs_operand(qb)  # validates the layout
    return pallas_kernels.block_scaled_matmul(
        _kernel_data(qa), _kernel_scales(qa, False), _kernel_data(qb), _kernel_scales(qb, True),
        blockwise.global_product(qa, qb), block_size=qa.block_size, scale_kind=_scale_kind(qa),
        variant=kernel_variant(), interpret=_interpret())


def ragged_matmul(qa: QArray, qb: QArray, group_sizes: jax.Array, backend: str) -> jax.Array:
    """qa [M, K] @ per-group qb [G, K, N] with jax.lax.ragged_dot semantics -> float32 [M, N]."""
    if resolve(backend) == "jnp":
        return grouped_matmul(dequantize(qa), dequantize(qb), group_sizes, precision=_HIGHEST,
                              preferred_element_type=jnp.float32)
    blockwise.rhs_operand(qb)
    return pallas_kernels.grouped_block_scaled_matmul(
        _kernel_data(qa), _kernel_scales(qa, False), _kernel_data(qb), _kernel_scales(qb, True),
        group_sizes.astype(jnp.int32), blockwise.global_product(qa, qb), block_size=qa.block_size,
        scale_kind=_scale_kind(qa), variant=kernel_variant(), interpret=_interpret())
