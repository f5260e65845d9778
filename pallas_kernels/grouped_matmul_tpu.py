"""TPU variant of the grouped block-scaled matmul: K grid axis, (8, 128)-tiled scale blocks.

Same contract as grouped_matmul.grouped_block_scaled_matmul. Scales enter as float32 multipliers
(x's transposed to [KB, M]); each grid step (row tile, column tile, K step) loops over the groups
present in its row tile (a [lo, hi) range read from SMEM) and adds each group's eight scale
blocks to the rows of that group in a float32 VMEM accumulator, so every row sees exactly the
reference's sequence of additions.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels import common, tile_math
from pallas_kernels.block_matmul_tpu import LANES, SCALE_ROWS, interpret_mma, k_step, scale_multipliers_t


def _kernel(lo_ref, hi_ref, rows_ref, x_ref, sx_ref, w_ref, sw_ref, g_ref, o_ref, acc_ref, *, bs: int, mma_kind: str):
    i, k = pl.program_id(0), pl.program_id(2)

    @pl.when(k == 0)
    def _():
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    rows = rows_ref[...]
    x, sx_t = x_ref[...], sx_ref[...].T

    def one_group(gi, acc):
        new = k_step(acc, x, sx_t, w_ref[gi], sw_ref[gi], bs, mma_kind)
        return jnp.where(rows == gi, new, acc)

    acc_ref[...] = lax.fori_loop(lo_ref[i], hi_ref[i], one_group, acc_ref[...])

    @pl.when(k == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = acc_ref[...] * g_ref[0, 0]


def grouped_matmul(x, sx, w, sw, group_sizes, global_scale, *, block_size: int, scale_kind: str,
                   interpret: bool) -> jax.Array:
    """TPU-layout ragged block-scaled matmul -> float32 [M, N]."""
    m, k = x.shape
    g, _, n = w.shape
    bk = SCALE_ROWS * block_size
    bm = common.pow2_tile(m, 256, LANES)
    bn = common.pow2_tile(n, 256, LANES)
    mp, np_, kp = common.round_up(m, bm), common.round_up(n, bn), common.round_up(k, bk)
    rows = common.row_groups(group_sizes, mp)
    lo, hi = common.tile_group_ranges(rows, bm, g)
    sx_t = common.pad_to(scale_multipliers_t(sx, scale_kind), (kp // block_size, mp), 1.0)
    sw_f = common.pad_to(tile_math.scale_value(sw, scale_kind), (g, kp // block_size, np_), 1.0)
    x, w = common.pad_to(x, (mp, kp)), common.pad_to(w, (g, kp, np_))
    smem = pl.BlockSpec(memory_space=pltpu.SMEM)
    out = pl.pallas_call(
        functools.partial(_kernel, bs=block_size, mma_kind=interpret_mma(interpret)),
        out_shape=jax.ShapeDtypeStruct((mp, np_), jnp.float32),
        grid=(mp // bm, np_ // bn, kp // bk),
        in_specs=[smem, smem, pl.BlockSpec((bm, 1), lambda i, j, kk: (i, 0)),
                  pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((SCALE_ROWS, bm), lambda i, j, kk: (kk, i)),
                  pl.BlockSpec((g, bk, bn), lambda i, j, kk: (0, kk, j)),
                  pl.BlockSpec((g, SCALE_ROWS, bn), lambda i, j, kk: (0, kk, j)), smem],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret, name="grouped_block_scaled_matmul_tpu",
    )(lo[:, 0], hi[:, 0], rows[:, None], x, sx_t, w, sw_f, common.global_scale_arg(global_scale))
    return out[:m, :n]
