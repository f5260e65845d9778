"""Blackwell (sm_100) variant of the grouped (ragged, per-expert) block-scaled matmul.

Glossary: M token rows sorted by expert, K contraction, N output columns, G experts (groups),
bs scale block, KB = K / bs, T row tiles of 128 rows, R = 128 * T rows of the aligned layout.
Contract (as grouped_matmul.grouped_block_scaled_matmul): x [M, K], sx [M, KB], w [G, K, N],
sw [G, KB, N], group_sizes [G] int32 (consecutive row ranges; rows past their sum give zeros),
optional FP32 global scale. Output float32 [M, N].

Rows are first re-laid out so that every group starts on a 128-row boundary (`aligned_rows`;
at most G * 127 zero rows of padding), so each 128-row tile belongs to exactly one group. One
CTA per (row tile, column tile) reads its tile's group and runs the dense Blackwell tile
(block_matmul_blackwell.mma_tile) on that expert's weights; tiles without rows do nothing.
The result is gathered back to the original row order. Numerics and testing as in
block_matmul_blackwell (no interpret mode; checked by lowering from CPU and by the GPU benchmark).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels import block_matmul_blackwell as bw
from pallas_kernels import common

TILE = bw.TMEM_ROWS


def aligned_rows(group_sizes: jax.Array, m: int, tile: int = TILE) -> tuple[jax.Array, jax.Array, int]:
    """Row layout where every group starts at a multiple of `tile`.

    group_sizes [G] int (sum <= m). Returns (dest [m] int32: the new row of each row, R for rows
    past sum(group_sizes); tile_group [R / tile] int32: the group owning each tile, -1 for tiles
    holding no rows; R, the static row count, an upper bound on the padded layout).
    """
    gs = group_sizes.astype(jnp.int32)
    g = gs.shape[0]
    rows = common.round_up(m + g * (tile - 1), tile)
    padded = -(-gs // tile) * tile
    pend = jnp.cumsum(padded)
    end = jnp.cumsum(gs)
    r = jnp.arange(m, dtype=jnp.int32)
    gid = jnp.searchsorted(end, r, side="right").astype(jnp.int32)
    gc = jnp.minimum(gid, g - 1)
    dest = jnp.where(gid < g, r - (end - gs)[gc] + (pend - padded)[gc], rows)
    starts = jnp.arange(rows // tile, dtype=jnp.int32) * tile
    tg = jnp.searchsorted(pend, starts, side="right").astype(jnp.int32)
    return dest.astype(jnp.int32), jnp.where(tg < g, tg, -1), rows


def scatter_rows(x: jax.Array, dest: jax.Array, rows: int, fill=0) -> jax.Array:
    """x [m, C] -> [rows, C] with row i at dest[i] (dest == rows: dropped); other rows `fill`."""
    base = jnp.full((rows, x.shape[1]), jnp.asarray(fill, x.dtype), x.dtype)
    return base.at[dest].set(x, mode="drop")


def launch(tile_group, x_op, w_op, sx_op, sw_op, plan: bw.Plan) -> jax.Array:
    """The kernel on prepared operands (see `grouped_matmul`) -> float32 [R, Np]."""
    def body(tg_gmem, x_gmem, w_gmem, sx_gmem, sw_gmem, out_gmem, **scratch):
        i = lax.axis_index("m")
        grp = tg_gmem[i]

        @pl.when(grp >= 0)
        def _():
            e = jnp.maximum(grp, 0)
            bw.mma_tile(x_gmem, w_gmem.at[e], sx_gmem, sw_gmem.at[e], out_gmem, scratch,
                        i=i, j=lax.axis_index("n"), plan=plan)

    return plgpu.kernel(
        body, out_type=jax.ShapeDtypeStruct((plan.mp, plan.np_), jnp.float32),
        grid=(plan.mp // TILE, plan.np_ // bw.BN), grid_names=("m", "n"),
        scratch_types=bw.scratch_types(plan), kernel_name="grouped_block_scaled_matmul_blackwell",
    )(tile_group, x_op, w_op, sx_op, sw_op)


def grouped_matmul(x, sx, w, sw, group_sizes, global_scale, *, block_size: int, scale_kind: str,
                   interpret: bool) -> jax.Array:
    """Blackwell ragged block-scaled matmul -> float32 [M, N]; see the module docstring."""
    bw.no_interpret(interpret)
    bw.check_target()
    m, k = x.shape
    n = w.shape[2]
    dest, tile_group, rows = aligned_rows(group_sizes, m)
    plan = bw.make_plan(rows, k, n, block_size, scale_kind)
    unit = bw.UNIT_SCALE[scale_kind]
    out = launch(tile_group,
                 bw.data_operand(scatter_rows(x, dest, rows), rows, plan),
                 bw.data_operand(jnp.swapaxes(w, 1, 2), plan.np_, plan),         # [G, Np, Kp]
                 bw.scale_operand(scatter_rows(sx, dest, rows, unit), scale_kind, plan),
                 bw.scale_operand(jnp.swapaxes(sw, 1, 2), scale_kind, plan),     # [G, Np/128, KBp/4, 32, 16]
                 plan)
    valid = (dest < rows)[:, None]
    y = jnp.where(valid, out[jnp.minimum(dest, rows - 1), :n], 0.0)
    return bw.apply_global(y, global_scale)
