"""Quantizing GEMM operands: zero-padding the blocked axes, 16x16 weight tiles, gradient keys,
group-aligned row layouts for the expert weight-gradient GEMM, and NVFP4 per-tensor scales of
tensors sharded inside `shard_map` (`amax_axes`).

Zero padding is exact: zeros do not change any block's amax and add nothing to a dot product.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from composer_jax.quant.formats import get_format
from composer_jax.quant.qarray import QArray
from composer_jax.quant.quantize import nvfp4_global_scale, quantize
from composer_jax.quant.vma import varying_axes


def global_scale(x: jax.Array, fmt: str, amax_axes: tuple[str, ...] = ()) -> jax.Array | None:
    """NVFP4 per-tensor scale of x taken over every shard along `amax_axes` (mesh axes, inside
    shard_map), so a sharded tensor is quantized with the scale of the whole (unsharded) tensor.

    None (quantize then uses x's own amax) for mxfp8, which has no per-tensor scale, or no axes.
    Zero rows (buffer padding) do not change the scale; NaN/Inf anywhere makes it NaN everywhere.
    """
    axes = varying_axes(x, amax_axes) if fmt == "nvfp4" else ()
    if not axes:
        return None
    return lax.pmax(nvfp4_global_scale(x), axes)


def pad_axes(x: jax.Array, axes: tuple[int, ...], multiple: int) -> jax.Array:
    """Zero-pad each of `axes` of x up to a multiple of `multiple`."""
    pads = [(0, 0)] * x.ndim
    for a in axes:
        pads[a] = (0, -x.shape[a] % multiple)
    return jnp.pad(x, pads) if any(p for _, p in pads) else x


def quant(x: jax.Array, fmt: str, axis: int, key: jax.Array | None = None,
          amax_axes: tuple[str, ...] = ()) -> QArray:
    """Quantize x along `axis` after zero-padding that axis to the block size (amax_axes: see
    `global_scale`)."""
    axis = axis % x.ndim
    return quantize(pad_axes(x, (axis,), get_format(fmt).block_size), fmt, axis, key=key,
                    global_scale=global_scale(x, fmt, amax_axes))


def quant_weight(w: jax.Array, fmt: str, amax_axes: tuple[str, ...] = ()) -> QArray:
    """Weights [..., K, N]: mxfp8 along K; nvfp4 in 16x16 tiles (K and N padded to 16)."""
    if fmt == "nvfp4":
        return quantize(pad_axes(w, (w.ndim - 2, w.ndim - 1), 16), fmt, block_2d=True,
                        global_scale=global_scale(w, fmt, amax_axes))
    return quant(w, fmt, w.ndim - 2)


def quant_weight_t(w: jax.Array, fmt: str, amax_axes: tuple[str, ...] = ()) -> QArray:
    """Transposed weights [..., N, K] blocked along N for the input-gradient GEMM.

    nvfp4 reuses the 16x16 tiles (transposed), so the backward sees the forward's exact values;
    mxfp8 re-quantizes the original weights along N.
    """
    if fmt == "nvfp4":
        q = quant_weight(w, fmt, amax_axes)
        return QArray(jnp.swapaxes(q.data, -1, -2), jnp.swapaxes(q.scales, -1, -2), q.global_scale,
                      q.fmt, q.block_size, q.axes)
    wt = jnp.swapaxes(w, -1, -2)
    return quant(wt, fmt, wt.ndim - 2)


def grad_keys(key: jax.Array | None, fmt: str) -> tuple[jax.Array | None, jax.Array | None, jax.Array]:
    """(SR key for dY in the dX GEMM, SR key for dY in the dW GEMM, RHT key).

    Only nvfp4 rounds gradients stochastically (mxfp8 always rounds to nearest). Without a key
    gradients round to nearest and the RHT uses a fixed sign pattern (deterministic).
    """
    if key is None or fmt != "nvfp4":
        return None, None, jax.random.PRNGKey(0)
    k_dx, k_dw, k_rht = jax.random.split(key, 3)
    return k_dx, k_dw, k_rht


def aligned_layout(group_sizes: jax.Array, m: int, block: int) -> tuple[jax.Array, jax.Array, int]:
    """Row layout where every group starts at a multiple of `block`.

    Returns (dest [m] int32: new row of each row, or the out-of-range size for rows past the
    groups; padded group sizes [G]; static padded row count). Quantization blocks and Hadamard
    blocks along rows then never straddle two groups.
    """
    gs = group_sizes.astype(jnp.int32)
    g = gs.shape[0]
    padded = -(-gs // block) * block
    start = jnp.cumsum(gs) - gs
    pstart = jnp.cumsum(padded) - padded
    rows = jnp.arange(m, dtype=jnp.int32)
    gid = jnp.searchsorted(jnp.cumsum(gs), rows, side="right")
    size = -(-m // block) * block + g * (block - 1)
    gid_c = jnp.minimum(gid, g - 1)
    dest = jnp.where(gid < g, rows - start[gid_c] + pstart[gid_c], size)
    return dest, padded, size


def scatter_rows(x: jax.Array, dest: jax.Array, size: int) -> jax.Array:
    """Place rows of x [m, D] at rows `dest` of a zero [size, D] array (rows at `size` are dropped)."""
    return jnp.zeros((size, x.shape[1]), x.dtype).at[dest].set(x, mode="drop")
