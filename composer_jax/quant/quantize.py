"""Reference quantize / dequantize for MXFP8 and NVFP4 (whole-array jnp; the numerics of record).

Shapes: x is any-rank [..., D, ...]; blocks run along `axis` (D must be a multiple of the block
size), or over 16x16 tiles of the last two axes [..., R, C] for NVFP4 weights (`block_2d=True`).

Non-finite inputs: a block holding NaN or +-Inf gets a NaN scale (E8M0 0xFF / E4M3 NaN), so the
whole block dequantizes to NaN (MXFP8 also stores NaN elements there); for NVFP4 the global scale is NaN too, so the whole tensor does.
Inputs below float32's normal range (|x| < 2**-126, including bf16 subnormals) are flushed to
zero by XLA; their blocks get the smallest scale and zero elements, never NaN.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from composer_jax.errors import ConfigError
from composer_jax.quant import rounding, scales
from composer_jax.quant.formats import MXFP8, NVFP4, check_input_dtype, get_format
from composer_jax.quant.qarray import QArray

NV_SCALE_MIN = 2.0**-9  # smallest positive E4M3 value: an all-zero NVFP4 block gets it
NV_GLOBAL_MIN = 2.0**-100  # floor so that scale * global stays a normal float32
NV_RANGE = NVFP4.elem_max * NVFP4.scale_max  # 6 * 448


def nvfp4_global_scale(x: jax.Array) -> jax.Array:
    """FP32 per-tensor NVFP4 scale amax(|x|) / (448 * 6), floored at 2**-100; NaN if x holds NaN/Inf."""
    xf = x.astype(jnp.float32)
    g = jnp.maximum(jnp.max(jnp.abs(xf)) / jnp.float32(NV_RANGE), jnp.float32(NV_GLOBAL_MIN))
    return jnp.where(jnp.all(jnp.isfinite(xf)), g, jnp.nan)


def _check(x, fmt: str, axis: int, block_2d: bool, key) -> tuple[object, tuple[int, ...]]:
    f = get_format(fmt)
    check_input_dtype(x)
    if x.ndim == 0:
        raise ConfigError("quantize needs an array with at least one axis")
    if block_2d:
        if f is not NVFP4 or x.ndim < 2:
            raise ConfigError("block_2d (16x16 weight tiles) is for nvfp4 arrays with >= 2 axes")
        axes = (x.ndim - 2, x.ndim - 1)
    else:
        if not -x.ndim <= axis < x.ndim:
            raise ConfigError(f"axis {axis} out of range for an array of rank {x.ndim}")
        axes = (axis % x.ndim,)
    for a in axes:
        if x.shape[a] % f.block_size:
            raise ConfigError(
                f"{fmt}: axis {a} has size {x.shape[a]}, not a multiple of the block size "
                f"{f.block_size}; pad it (zeros do not change a block's scale)")
    if key is not None and f is not NVFP4:
        raise ConfigError("stochastic rounding (key=...) is implemented for nvfp4 only")
    return f, axes


def _blocked(x: jax.Array, axes: tuple[int, ...], b: int) -> jax.Array:
    """[..., D] -> [..., D/b, b] (1-D) or [..., R, C] -> [..., R/b, b, C/b, b] (2-D), after moving axes last."""
    if len(axes) == 1:
        x = jnp.moveaxis(x, axes[0], -1)
        return x.reshape(*x.shape[:-1], x.shape[-1] // b, b)
    *lead, r, c = x.shape
    return x.reshape(*lead, r // b, b, c // b, b)


def _unblocked(xb: jax.Array, axes: tuple[int, ...]) -> jax.Array:
    if len(axes) == 1:
        x = xb.reshape(*xb.shape[:-2], -1)
        return jnp.moveaxis(x, -1, axes[0])
    *lead, rb, b, cb, _ = xb.shape
    return xb.reshape(*lead, rb * b, cb * b)


def _block_amax(xb: jax.Array, two_d: bool) -> jax.Array:
    """Per-block max |x|, kept with broadcastable singleton axes."""
    return jnp.max(jnp.abs(xb), axis=(-3, -1) if two_d else (-1,), keepdims=True)


def _squeeze_scales(s: jax.Array, axes: tuple[int, ...]) -> jax.Array:
    """Broadcastable per-block array -> scales layout (blocked axes divided by the block size)."""
    if len(axes) == 2:
        return s[..., :, 0, :, 0]
    return jnp.moveaxis(s[..., 0], -1, axes[0])


def _expand_scales(s: jax.Array, axes: tuple[int, ...]) -> jax.Array:
    """Inverse of `_squeeze_scales`."""
    if len(axes) == 2:
        return s[..., :, None, :, None]
    return jnp.moveaxis(s, axes[0], -1)[..., None]


def _block_finite(xb: jax.Array, two_d: bool) -> jax.Array:
    """Per-block "no NaN/Inf" flag (explicit: a max reduction need not propagate NaN on every backend)."""
    return jnp.all(jnp.isfinite(xb), axis=(-3, -1) if two_d else (-1,), keepdims=True)


def _quantize_mxfp8(xb: jax.Array) -> tuple[jax.Array, jax.Array]:
    amax = _block_amax(xb, False)
    e = scales.mx_exponent(amax)
    finite = _block_finite(xb, False)
    y = jnp.clip(xb * scales.pow2(-e), -MXFP8.elem_max, MXFP8.elem_max)
    y = jnp.where(finite, y, jnp.nan)  # a non-finite block is all NaN (and has a NaN scale)
    return y.astype(MXFP8.elem_dtype), scales.e8m0_from_exponent(e, finite)


def _quantize_nvfp4(xb, two_d, global_scale, bits) -> tuple[jax.Array, jax.Array]:
    amax = _block_amax(xb, two_d)
    s = jnp.clip(amax / (global_scale * jnp.float32(NVFP4.elem_max)), NV_SCALE_MIN, NVFP4.scale_max)
    s = jnp.where(_block_finite(xb, two_d), s, jnp.nan).astype(NVFP4.scale_dtype)
    v = jnp.clip(xb / (s.astype(jnp.float32) * global_scale), -NVFP4.elem_max, NVFP4.elem_max)
    return rounding.to_e2m1(v, bits), s


def quantize(x: jax.Array, fmt: str, axis: int = -1, *, block_2d: bool = False,
             key: jax.Array | None = None, global_scale: jax.Array | None = None) -> QArray:
    """Block-quantize `x` to `fmt` ("mxfp8" or "nvfp4") with blocks along `axis`.

    Args:
      x: float32/bfloat16/float16 array [..., D, ...]; D = x.shape[axis] must be a multiple of the
        block size (32 for mxfp8, 16 for nvfp4).
      fmt: "mxfp8" (E4M3 elements, E8M0 scale per 32, rounded up so nothing overflows) or "nvfp4"
        (E2M1 elements, E4M3 scale per 16 rounded to nearest and clipped to [2**-9, 448], FP32
        global scale).
      axis: the blocked (contraction) axis.
      block_2d: nvfp4 only: 16x16 tiles over the last two axes [..., R, C] (weights, so that the
        forward and the transposed backward GEMM see the same values); `axis` is then ignored.
      key: nvfp4 only: a PRNG key; elements are then stochastically rounded (unbiased).
      global_scale: nvfp4 only: FP32 scalar to use instead of amax(|x|) / 2688.
    Returns:
      QArray with data [x.shape], scales [x.shape with blocked axes divided by the block size].
    """
    f, axes = _check(x, fmt, axis, block_2d, key)
    b = f.block_size
    xb = _blocked(x.astype(jnp.float32), axes, b)
    if f is MXFP8:
        data, s = _quantize_mxfp8(xb)
        gs = None
    else:
        gs = nvfp4_global_scale(x) if global_scale is None else jnp.asarray(global_scale, jnp.float32)
        bits = None if key is None else _blocked(rounding.sr_bits(key, x.shape), axes, b)
        data, s = _quantize_nvfp4(xb, block_2d, gs, bits)
    return QArray(_unblocked(data, axes), _squeeze_scales(s, axes), gs, f.name, b, axes)


def scale_values(q: QArray) -> jax.Array:
    """Float32 block-scale multipliers, scales layout (for nvfp4: E4M3 scale, without the global)."""
    if q.fmt == MXFP8.name:
        return scales.e8m0_to_f32(q.scales)
    return q.scales.astype(jnp.float32)


def dequantize(q: QArray) -> jax.Array:
    """float32 array [q.shape] = data * block scale (* global scale for nvfp4)."""
    if not isinstance(q, QArray):
        raise ConfigError(f"dequantize takes a QArray, got {type(q).__name__}")
    f = get_format(q.fmt)
    db = _blocked(q.data.astype(jnp.float32), q.axes, f.block_size)
    s = _expand_scales(scale_values(q), q.axes)
    if q.global_scale is not None:
        s = s * q.global_scale
    return _unblocked(db * s, q.axes)
