"""Bit-level helpers for block scales: E8M0 exponents and power-of-two multipliers.

E8M0 bytes are built with integer operations: casting a float to float8_e8m0fnu rounds to the
nearest power of two and maps 0 to NaN, which is wrong for a scale that must round *up*.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

E8M0_NAN = 255
E8M0_MIN_EXP = -127
E8M0_MAX_EXP = 127
# 448 = 1.75 * 2**8: E4M3's largest finite value, as (mantissa bits of 1.75, exponent 8).
_E4M3_MAX_MANT = 0x600000
_E4M3_MAX_EXP = 8


def mx_exponent(amax: jax.Array) -> jax.Array:
    """Smallest integer e with 448 * 2**e >= amax, i.e. ceil(log2(amax / 448)), clamped to [-127, 127].

    Exact (no division): with amax = (1 + f) * 2**E, e = E - 8 + [1 + f > 1.75]. A zero (or
    flushed subnormal) amax gives -127, the smallest E8M0 scale. Shapes: any; returns int32.
    """
    bits = lax.bitcast_convert_type(jnp.abs(amax.astype(jnp.float32)), jnp.int32)
    biased = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    e = biased - 127 - _E4M3_MAX_EXP + (mant > _E4M3_MAX_MANT).astype(jnp.int32)
    return jnp.clip(e, E8M0_MIN_EXP, E8M0_MAX_EXP)


def pow2(e: jax.Array) -> jax.Array:
    """2.0**e as float32 for integer e in [-126, 127], built from the exponent bits (exact)."""
    return lax.bitcast_convert_type((e.astype(jnp.int32) + 127) << 23, jnp.float32)


def e8m0_from_exponent(e: jax.Array, finite: jax.Array) -> jax.Array:
    """E8M0 scales (dtype float8_e8m0fnu) from exponents; blocks where `finite` is False get NaN (0xFF)."""
    byte = jnp.where(finite, e + 127, E8M0_NAN).astype(jnp.uint8)
    return lax.bitcast_convert_type(byte, jnp.float8_e8m0fnu)


def e8m0_to_f32(scales: jax.Array) -> jax.Array:
    """Float32 value of E8M0 scales: 2**(byte - 127); 0xFF is NaN; byte 0 is 2**-127 (an f32 subnormal,
    which XLA flushes to zero in arithmetic)."""
    byte = lax.bitcast_convert_type(scales, jnp.uint8).astype(jnp.int32)
    bits = jnp.where(byte == 0, 0x00400000, byte << 23)
    value = lax.bitcast_convert_type(bits, jnp.float32)
    return jnp.where(byte == E8M0_NAN, jnp.nan, value)
