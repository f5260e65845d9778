"""Rounding of scaled values onto the E2M1 grid {0, 0.5, 1, 1.5, 2, 3, 4, 6}: nearest-even and stochastic."""

from __future__ import annotations

import jax
import jax.numpy as jnp

E2M1_MAX = 6.0


def uniform_from_bits(bits: jax.Array) -> jax.Array:
    """Uniform float32 in [0, 1) from uint32 random bits (top 24 bits, exact)."""
    return (bits >> 8).astype(jnp.float32) * jnp.float32(2.0**-24)


def e2m1_step(magnitude: jax.Array) -> jax.Array:
    """Spacing of the E2M1 grid at |v|: 0.5 below 2, 1 below 4, 2 up to 6."""
    return jnp.where(magnitude < 2.0, 0.5, jnp.where(magnitude < 4.0, 1.0, 2.0)).astype(jnp.float32)


def round_e2m1_stochastic(v: jax.Array, bits: jax.Array) -> jax.Array:
    """Stochastically round float32 `v` (already clipped to [-6, 6]) onto the E2M1 grid.

    Rounds |v| up to the next grid point with probability (|v| - lo) / step, so the result is
    unbiased: E[round(v)] = v. `bits` (uint32, same shape as v) drive the coin flips. Every step is
    exact in float32 (divisions by powers of two). Returns float32 values on the grid.
    """
    mag = jnp.abs(v)
    step = e2m1_step(mag)
    lo = jnp.floor(mag / step) * step
    frac = (mag - lo) / step
    up = uniform_from_bits(bits) < frac
    rounded = jnp.where(up, lo + step, lo)
    return jnp.where(v < 0, -rounded, rounded)


def to_e2m1(v: jax.Array, bits: jax.Array | None = None) -> jax.Array:
    """float32 values in [-6, 6] -> float4_e2m1fn, nearest-even (bits None) or stochastic."""
    if bits is not None:
        v = round_e2m1_stochastic(v, bits)
    return v.astype(jnp.float4_e2m1fn)


def sr_bits(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """uint32 random bits for stochastic rounding of an array of `shape` (one word per element)."""
    return jax.random.bits(key, shape, jnp.uint32)
