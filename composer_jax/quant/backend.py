"""GEMMs on QArrays through either backend: "jnp" (dequantize, one float32 dot; the default on
CPU) or "pallas" (the block-scaled kernels in pallas_kernels, variant chosen by the platform:
"tpu" on TPU, "hopper" on GPU, the interpret-mode "portable" kernel on CPU). "auto" picks jnp on
CPU and pallas elsewhere.

Glossary: M rows, K contraction, N columns, G groups.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

import pallas_kernels
from composer_jax.errors import ConfigError
from composer_jax.quant.grouped import grouped_matmul
from composer_jax.quant import blockwise
from composer_jax.quant.qarray import QArray
from composer_jax.quant.quantize import dequantize

BACKENDS = ("auto", "jnp", "pallas")
_HIGHEST = lax.Precision.HIGHEST


def resolve(backend: str) -> str:
    """"jnp" or "pallas" for a requested backend name."""
    if backend not in BACKENDS:
        raise ConfigError(f"unknown quantized-dot backend {backend!r}; valid: {BACKENDS}")
    if backend == "auto":
        return "jnp" if jax.default_backend() == "cpu" else "pallas"
    return backend


def kernel_variant() -> str:
    """The pallas_kernels variant for the default device."""
    platform = jax.default_backend()
    if platform == "tpu":
        return "tpu"
    return "portable" if platform == "cpu" else "hopper"


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
        variant=kernel_variant())


def ragged_matmul(qa: QArray, qb: QArray, group_sizes: jax.Array, backend: str) -> jax.Array:
    """qa [M, K] @ per-group qb [G, K, N] with jax.lax.ragged_dot semantics -> float32 [M, N]."""
    if resolve(backend) == "jnp":
        return grouped_matmul(dequantize(qa), dequantize(qb), group_sizes, precision=_HIGHEST,
                              preferred_element_type=jnp.float32)
    blockwise.rhs_operand(qb)
    return pallas_kernels.grouped_block_scaled_matmul(
        _kernel_data(qa), _kernel_scales(qa, False), _kernel_data(qb), _kernel_scales(qb, True),
        group_sizes.astype(jnp.int32), blockwise.global_product(qa, qb), block_size=qa.block_size,
        scale_kind=_scale_kind(qa), variant=kernel_variant())
