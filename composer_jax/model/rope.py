"""Rotary position embedding: plain and YaRN, interleaved and half-rotated layouts.

YaRN (Peng et al. 2023, as implemented for DeepSeek-V3 / Kimi K2): frequencies whose wavelength is
short compared with the original context are kept (extrapolated), long ones are divided by `factor`
(interpolated), with a linear ramp between the correction dims given by beta_fast / beta_slow.
cos/sin are multiplied by the attention factor mscale(factor, mscale) / mscale(factor, mscale_all_dim);
DeepSeek additionally multiplies the softmax scale by mscale(factor, mscale_all_dim)^2
(`softmax_scale_multiplier`).

Shape glossary: B batch, T tokens, H heads, R rope dims (even).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from composer_jax.config import RopeConfig, RopeScaling


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """0.1 * mscale * ln(scale) + 1 for scale > 1, else 1."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _correction_dim(num_rotations: float, dim: int, base: float, max_pos: int) -> float:
    return (dim * math.log(max_pos / (num_rotations * 2 * math.pi))) / (2 * math.log(base))


def rope_frequencies(rope: RopeConfig, dim: int) -> tuple[np.ndarray, float]:
    """Inverse frequencies [R/2] (float32) and the cos/sin attention factor for `dim` rope dims."""
    exponents = np.arange(0, dim, 2, dtype=np.float64) / dim
    pos_freqs = rope.theta ** exponents
    inv_freq = 1.0 / pos_freqs
    if rope.scaling == RopeScaling.NONE or rope.factor == 1.0:
        return inv_freq.astype(np.float32), 1.0
    low = math.floor(_correction_dim(rope.beta_fast, dim, rope.theta, rope.original_max_position))
    high = math.ceil(_correction_dim(rope.beta_slow, dim, rope.theta, rope.original_max_position))
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    extrapolation_weight = 1.0 - ramp
    inv_freq = (inv_freq / rope.factor) * (1 - extrapolation_weight) + inv_freq * extrapolation_weight
    if rope.mscale and rope.mscale_all_dim:
        attention_factor = yarn_mscale(rope.factor, rope.mscale) / yarn_mscale(rope.factor,
                                                                               rope.mscale_all_dim)
    else:
        attention_factor = yarn_mscale(rope.factor)
    return inv_freq.astype(np.float32), float(attention_factor)


def softmax_scale_multiplier(rope: RopeConfig) -> float:
    """Factor on 1/sqrt(qk_head_dim): mscale(factor, mscale_all_dim)^2 under YaRN, else 1."""
    if rope.scaling == RopeScaling.YARN and rope.mscale_all_dim:
        m = yarn_mscale(rope.factor, rope.mscale_all_dim)
        return m * m
    return 1.0


def rope_cos_sin(positions: jax.Array, inv_freq: np.ndarray, attention_factor: float):
    """cos, sin [B, T, R/2] (float32) for integer positions [B, T]."""
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)
    return jnp.cos(angles) * attention_factor, jnp.sin(angles) * attention_factor


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array, interleaved: bool) -> jax.Array:
    """Rotates x [B, T, H, R] by cos/sin [B, T, R/2].

    interleaved: pairs are (x[2i], x[2i+1]); the output is written in the same interleaved layout.
    Otherwise pairs are (x[i], x[i + R/2]) (HF `rotate_half`). Both layouts give identical q.k
    products for the layout the checkpoint was trained in.
    """
    dt = x.dtype
    xf = x.astype(jnp.float32)
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    if interleaved:
        x1, x2 = xf[..., 0::2], xf[..., 1::2]
        out = jnp.stack([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).reshape(xf.shape)
    else:
        half = xf.shape[-1] // 2
        x1, x2 = xf[..., :half], xf[..., half:]
        out = jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
    return out.astype(dt)
