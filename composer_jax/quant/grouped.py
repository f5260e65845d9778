"""Grouped (per-expert) matmul: out[i] = x[i] @ w[group(i)] for rows sorted by group.

Two implementations with the same contract as `jax.lax.ragged_dot`:
  * `ragged_dot`: XLA's grouped GEMM (native on GPU/TPU). On CPU, XLA lowers it to a dense loop over
    every group for every row, i.e. G times the useful FLOPs.
  * `blocked_grouped_matmul`: rows are scattered into a padded layout where every group starts on a
    multiple of `block` rows, so each block of rows belongs to one group; one batched matmul over the
    blocks does the work with at most G * block padding rows. This is the CPU default.

Shape glossary: M rows (sorted by group), K contraction, N output, G groups, J blocks, b block rows.
"""
from __future__ import annotations

import enum

import jax
import jax.numpy as jnp

from composer_jax.parallel import target


class GroupedImpl(str, enum.Enum):
    AUTO = "auto"           # blocked on CPU, ragged_dot elsewhere
    RAGGED_DOT = "ragged_dot"
    BLOCKED = "blocked"


def blocked_grouped_matmul(x: jax.Array, w: jax.Array, group_sizes: jax.Array, block: int = 64,
                           preferred_element_type=jnp.float32, precision=None) -> jax.Array:
    """x [M, K] sorted by group, w [G, K, N], group_sizes [G] (sum <= M) -> [M, N].

    Rows past sum(group_sizes) produce zeros, as with `jax.lax.ragged_dot`.
    """
    m, k = x.shape
    g, _, n = w.shape
    sizes = group_sizes.astype(jnp.int32)
    starts = jnp.cumsum(sizes) - sizes                                   # [G]
    padded = (sizes + block - 1) // block * block
    padded_starts = jnp.cumsum(padded) - padded                          # [G]
    num_blocks = (m + block - 1) // block + g                            # static upper bound
    rows = jnp.arange(m)
    row_group = jnp.clip(jnp.searchsorted(jnp.cumsum(sizes), rows, side="right"), 0, g - 1)
    valid = rows < sizes.sum()
    dest = jnp.where(valid, rows - starts[row_group] + padded_starts[row_group], num_blocks * block)
    xp = jnp.zeros((num_blocks * block, k), x.dtype).at[dest].set(x, mode="drop")
    block_start = jnp.arange(num_blocks) * block
    block_group = jnp.clip(jnp.searchsorted(padded_starts + padded, block_start, side="right"),
                           0, g - 1)
    yb = jnp.einsum("jbk,jkn->jbn", xp.reshape(num_blocks, block, k), w[block_group],
                    preferred_element_type=preferred_element_type, precision=precision)
    y = yb.reshape(num_blocks * block, n)
    return jnp.where(valid[:, None], y[jnp.minimum(dest, num_blocks * block - 1)], 0)


def grouped_matmul(x: jax.Array, w: jax.Array, group_sizes: jax.Array,
                   impl: GroupedImpl = GroupedImpl.AUTO, preferred_element_type=jnp.float32,
                   precision=None):
    """Dispatches to `ragged_dot` or `blocked_grouped_matmul` (see module docstring).

    Used by the model's bf16 expert FFNs and by the quantized dots' jnp path.
    """
    if impl == GroupedImpl.AUTO:
        impl = GroupedImpl.BLOCKED if target.platform() == "cpu" else GroupedImpl.RAGGED_DOT
    if impl == GroupedImpl.BLOCKED:
        return blocked_grouped_matmul(x, w, group_sizes, preferred_element_type=preferred_element_type,
                                      precision=precision)
    return jax.lax.ragged_dot(x, w, group_sizes, preferred_element_type=preferred_element_type,
                              precision=precision)
