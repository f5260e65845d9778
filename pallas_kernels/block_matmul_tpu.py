"""TPU variant of the block-scaled matmul: (8, 128)-tiled scale blocks and a K grid axis.

Scales enter as float32 multipliers laid out [KB, M] and [KB, N], so a grid step's scale blocks
are (8, bm) and (8, bn): eight K scale blocks by a lane-dense 128-multiple, exactly Mosaic's
(8, 128) tile. Each step covers bk = 8 * bs of K with eight bf16 MXU dots (E4M3 and E2M1 values
are exact in bf16; float32 in interpret mode, where CPU bf16 dots sum in another order), rescaled and accumulated in a float32 VMEM scratch; the K axis is "arbitrary"
(sequential), so the accumulation order is the reference's. M, N and K are zero-padded.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels import common, mma, tile_math

SCALE_ROWS = 8  # scale blocks per grid step: the sublane count of a float32 tile
LANES = 128


def _kernel(a_ref, sa_ref, b_ref, sb_ref, g_ref, o_ref, acc_ref, *, bs: int, mma_kind: str):
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _():
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    acc_ref[...] = k_step(acc_ref[...], a_ref[...], sa_ref[...].T, b_ref[...], sb_ref[...], bs, mma_kind)

    @pl.when(k == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = acc_ref[...] * g_ref[0, 0]


def k_step(acc, a, sa_t, b, sb, bs: int, mma_kind: str) -> jax.Array:
    """One grid step: eight scale blocks in order. a [bm, 8*bs], sa_t [bm, 8], b [8*bs, bn], sb [8, bn]."""
    for j in range(SCALE_ROWS):
        part = mma.block_dot(a[:, j * bs:(j + 1) * bs], b[j * bs:(j + 1) * bs, :], mma_kind)
        acc = mma.rescale_add(acc, part, sa_t[:, j:j + 1], sb[j:j + 1, :])
    return acc


def interpret_mma(interpret: bool) -> str:
    """bf16 on the MXU; float32 in interpret mode (CPU bf16 dots sum in a different order)."""
    return "f32" if interpret else "bf16"


def scale_multipliers_t(s: jax.Array, kind: str) -> jax.Array:
    """[rows, KB] scales (bytes or E4M3) -> float32 multipliers [KB, rows] (decoded outside the kernel)."""
    return tile_math.scale_value(s, kind).T


def matmul(a, sa, b, sb, global_scale, *, block_size: int, scale_kind: str, interpret: bool) -> jax.Array:
    """TPU-layout block-scaled matmul; same contract as block_matmul.block_scaled_matmul."""
    m, k = a.shape
    n = b.shape[1]
    bk = SCALE_ROWS * block_size
    bm = common.pow2_tile(m, 256, LANES)
    bn = common.pow2_tile(n, 256, LANES)
    mp, np_, kp = common.round_up(m, bm), common.round_up(n, bn), common.round_up(k, bk)
    sa_t = common.pad_to(scale_multipliers_t(sa, scale_kind), (kp // block_size, mp), 1.0)
    sb_f = common.pad_to(tile_math.scale_value(sb, scale_kind), (kp // block_size, np_), 1.0)
    a, b = common.pad_to(a, (mp, kp)), common.pad_to(b, (kp, np_))
    g = common.global_scale_arg(global_scale)
    out = pl.pallas_call(
        functools.partial(_kernel, bs=block_size, mma_kind=interpret_mma(interpret)),
        out_shape=jax.ShapeDtypeStruct((mp, np_), jnp.float32),
        grid=(mp // bm, np_ // bn, kp // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                  pl.BlockSpec((SCALE_ROWS, bm), lambda i, j, kk: (kk, i)),
                  pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
                  pl.BlockSpec((SCALE_ROWS, bn), lambda i, j, kk: (kk, j)),
                  pl.BlockSpec(memory_space=pltpu.SMEM)],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret, name="block_scaled_matmul_tpu")(a, sa_t, b, sb_f, g)
    return out[:m, :n]
