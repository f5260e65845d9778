"""Shared plumbing for the kernels: interpret-mode default, padding, variant names, tile sizes and
the row-tile -> group ranges of the grouped matmuls (every variant imports them from here)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

PORTABLE = "portable"
HOPPER = "hopper"
BLACKWELL = "blackwell"
TPU = "tpu"
VARIANTS = (PORTABLE, HOPPER, BLACKWELL, TPU)


def check_variant(variant: str) -> str:
    if variant not in VARIANTS:
        raise ValueError(f"unknown kernel variant {variant!r}; valid: {VARIANTS}")
    return variant


def default_interpret() -> bool:
    """Interpret mode unless the default backend is a GPU or TPU."""
    return jax.default_backend() not in ("gpu", "cuda", "rocm", "tpu")


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def pad_to(x: jax.Array, shape: tuple[int, ...], value=0) -> jax.Array:
    """Pad x at the end of each axis up to `shape` (never truncates)."""
    pads = [(0, t - s) for s, t in zip(x.shape, shape)]
    if any(p < 0 for _, p in pads):
        raise ValueError(f"cannot pad shape {x.shape} to smaller {shape}")
    if not any(p for _, p in pads):
        return x
    return jnp.pad(x, pads, constant_values=jnp.asarray(value, x.dtype))


def pow2_tile(n: int, cap: int, floor: int) -> int:
    """A power-of-two tile in [floor, cap] no larger than needed to cover n."""
    t = floor
    while t < cap and t < n:
        t *= 2
    return t


def check_2d(name: str, x: jax.Array) -> None:
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got shape {x.shape}")


def global_scale_arg(global_scale) -> jax.Array:
    """The (1, 1) float32 global-scale operand of a matmul kernel (1.0 when there is none: exact)."""
    if global_scale is None:
        return jnp.ones((1, 1), jnp.float32)
    return jnp.asarray(global_scale, jnp.float32).reshape(1, 1)


def row_groups(group_sizes: jax.Array, m: int) -> jax.Array:
    """int32 [m]: the group of each row; rows past sum(group_sizes) get G."""
    ends = jnp.cumsum(group_sizes.astype(jnp.int32))
    return jnp.searchsorted(ends, jnp.arange(m, dtype=jnp.int32), side="right").astype(jnp.int32)


def tile_group_ranges(rows: jax.Array, bm: int, num_groups: int) -> tuple[jax.Array, jax.Array]:
    """Per row tile, the [lo, hi) range of groups present (empty for tiles past the last group)."""
    first = rows[::bm]
    last = jnp.minimum(rows[bm - 1::bm], num_groups - 1)
    hi = jnp.where(first >= num_groups, first, last + 1)
    return first[:, None], hi[:, None]
