"""Element-wise math used inside kernels (tile-shaped arrays; only ops that Triton and Mosaic lower).

Kept free of fp4 dtypes: E2M1 results are produced as float32 values on the E2M1 grid, which the
kernels store as float8_e4m3fn (every E2M1 value is exactly representable in E4M3).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

E4M3_MAX = 448.0
E2M1_MAX = 6.0
NV_SCALE_MIN = 2.0**-9
SCALE_E8M0 = "e8m0"
SCALE_E4M3 = "e4m3"
SCALE_F32 = "f32"


def mx_exponent(amax: jax.Array) -> jax.Array:
    """int32 ceil(log2(amax / 448)) in [-127, 127] from the bits of amax (448 = 1.75 * 2**8)."""
    bits = lax.bitcast_convert_type(jnp.abs(amax), jnp.int32)
    over = (bits & 0x7FFFFF) > 0x600000
    e = ((bits >> 23) & 0xFF) - 135 + over.astype(jnp.int32)
    return jnp.minimum(jnp.maximum(e, -127), 127)


def exp2_int(e: jax.Array) -> jax.Array:
    """float32 2**e for int32 e in [-126, 127] (exponent-field construction)."""
    return lax.bitcast_convert_type((e + 127) << 23, jnp.float32)


def e8m0_value(byte: jax.Array) -> jax.Array:
    """float32 value of E8M0 bytes held in an integer array: 2**(b-127); 255 -> NaN; 0 -> 2**-127."""
    b = byte.astype(jnp.int32)
    v = lax.bitcast_convert_type(jnp.where(b == 0, 0x00400000, b << 23), jnp.float32)
    return jnp.where(b == 255, jnp.float32(jnp.nan), v)


def scale_value(s: jax.Array, kind: str) -> jax.Array:
    """float32 multiplier of a scale tile stored as E8M0 bytes (uint8), E4M3, or already float32."""
    if kind == SCALE_E8M0:
        return e8m0_value(s)
    return s.astype(jnp.float32)


def e2m1_step(mag: jax.Array) -> jax.Array:
    return jnp.where(mag < 2.0, 0.5, jnp.where(mag < 4.0, 1.0, 2.0)).astype(jnp.float32)


def e2m1_nearest(v: jax.Array) -> jax.Array:
    """Round float32 v in [-6, 6] to the nearest E2M1 value, ties to even code."""
    mag = jnp.abs(v)
    step = e2m1_step(mag)
    t = mag / step  # exact: step is a power of two
    lo = jnp.floor(t)
    d = t - lo
    odd = (lo - 2.0 * jnp.floor(lo * 0.5)) == 1.0
    r = jnp.where((d > 0.5) | ((d == 0.5) & odd), lo + 1.0, lo) * step
    return jnp.where(jnp.signbit(v), -r, r)  # keeps -0 like an IEEE cast


def e2m1_stochastic(v: jax.Array, bits: jax.Array) -> jax.Array:
    """Unbiased stochastic rounding of v in [-6, 6] onto the E2M1 grid driven by uint32 `bits`."""
    mag = jnp.abs(v)
    step = e2m1_step(mag)
    lo = jnp.floor(mag / step) * step
    u = (bits >> 8).astype(jnp.float32) * jnp.float32(2.0**-24)
    rounded = jnp.where(u < (mag - lo) / step, lo + step, lo)
    return jnp.where(v < 0, -rounded, rounded)
