"""MXFP8 on the wire: token rows as E4M3 bytes plus E8M0 scale bytes for the expert all-to-all.

Glossary: R rows (tokens), D features (model dim), Dp = D rounded up to 32, W = Dp + Dp / 32.

encode(x [R, D]) -> uint8 [R, W]: the MXFP8 quantization of each row along D (the expert GEMM's
contraction axis), E4M3 element bytes then one E8M0 scale byte per 32; 1 + 1/32 bytes per value
instead of bf16's 2. decode(bytes [R, W]) -> [R, D] = dequantize (an all-zero row decodes to 0).

Why this keeps the expert matmul's numerics: the MXFP8 dot quantizes its input rows along D with
exactly these blocks, and re-quantizing decode(encode(x)) reproduces the same values (each block's
largest magnitude is on the E4M3 grid times 2**e, so the new exponent is e, or e - 1 when that
magnitude is exactly 224 * 2**e, and either way every element is exactly representable):
quantize(decode(encode(x))) and quantize(x) dequantize identically. The forward output and the
input gradient are therefore unchanged. Only the expert weight-gradient GEMM, which re-quantizes
its saved input along the token axis, sees Q(x) instead of x; with power-of-two block scales
both round each element to the same 3-bit mantissa unless it lies in E4M3's subnormal range
(below ~2**-15 of its block's max), so dW changes only in those negligible terms.
NaN/Inf in a block give a NaN scale byte and NaN on decode, as the quantized dot itself would.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from composer_jax.errors import ConfigError
from composer_jax.quant.formats import MXFP8, check_input_dtype
from composer_jax.quant.operands import quant
from composer_jax.quant.qarray import QArray
from composer_jax.quant.quantize import dequantize


def wire_width(d: int) -> int:
    """Bytes per row of an encoded [R, d] array."""
    dp = -(-d // MXFP8.block_size) * MXFP8.block_size
    return dp + dp // MXFP8.block_size


def encode_mxfp8_rows(x: jax.Array) -> jax.Array:
    """x [R, D] float -> uint8 [R, W]: MXFP8 along D (zero-padded to 32), data bytes then scale bytes."""
    if x.ndim != 2:
        raise ConfigError(f"encode_mxfp8_rows wants rows [R, D], got shape {x.shape}")
    check_input_dtype(x, "x")
    q = quant(x, "mxfp8", 1)
    return jnp.concatenate([lax.bitcast_convert_type(q.data, jnp.uint8),
                            lax.bitcast_convert_type(q.scales, jnp.uint8)], axis=1)


def decode_mxfp8_rows(b: jax.Array, d: int, dtype=jnp.float32) -> jax.Array:
    """uint8 [R, W] from `encode_mxfp8_rows` of [R, d] rows -> [R, d] in `dtype` (dequantized)."""
    if b.ndim != 2 or b.dtype != jnp.uint8 or b.shape[1] != wire_width(d):
        raise ConfigError(f"decode_mxfp8_rows wants uint8 [R, {wire_width(d)}] for d={d}, "
                          f"got {b.dtype} {b.shape}")
    dp = wire_width(d) * MXFP8.block_size // (MXFP8.block_size + 1)
    q = QArray(lax.bitcast_convert_type(b[:, :dp], jnp.float8_e4m3fn),
               lax.bitcast_convert_type(b[:, dp:], jnp.float8_e8m0fnu), None, "mxfp8",
               MXFP8.block_size, (1,))
    return dequantize(q)[:, :d].astype(dtype)
