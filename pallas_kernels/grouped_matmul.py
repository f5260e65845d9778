"""Grouped (ragged, per-expert) block-scaled matmul for MoE experts, jax.lax.ragged_dot semantics.

Glossary: M token rows sorted by expert, K contraction, N output columns, G experts (groups),
bs scale block, KB = K / bs. Inputs: x [M, K], sx [M, KB], w [G, K, N], sw [G, KB, N] (E4M3 data;
E8M0 bytes or E4M3 scales), group_sizes [G] int32 (consecutive row ranges; rows past their sum
produce zeros), optional FP32 global scale. Output float32 [M, N].

Each program owns an (bm, bn) output tile and loops over just the groups whose rows intersect it
(a [lo, hi) range computed from the group sizes), accumulating each group's K loop and keeping
the rows that belong to it. M and N are zero-padded to the tiles, never truncated.
Variants as block_matmul; "tpu" and "blackwell" live in grouped_matmul_tpu / _blackwell.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels import common, grouped_matmul_tpu, mma
from pallas_kernels.block_matmul import mma_kind


def _kernel(lo_ref, hi_ref, rows_ref, x_ref, sx_ref, w_ref, sw_ref, g_ref, o_ref, *,
            bs: int, kb: int, kind: str, mma_kind: str):
    rows = rows_ref[...]  # [bm, 1] group id of each row

    def one_group(gi, out):
        acc = mma.accumulate_k(
            lambda k: x_ref[:, pl.ds(k * bs, bs)], lambda k: sx_ref[:, pl.ds(k, 1)],
            lambda k: w_ref[gi, pl.ds(k * bs, bs), :], lambda k: sw_ref[gi, pl.ds(k, 1), :],
            kb=kb, shape=o_ref.shape, kind=kind, mma_kind=mma_kind)
        return jnp.where(rows == gi, acc, out)

    out = lax.fori_loop(lo_ref[0, 0], hi_ref[0, 0], one_group, jnp.zeros(o_ref.shape, jnp.float32))
    o_ref[...] = out * g_ref[0, 0]


@functools.partial(jax.jit, static_argnames=("block_size", "scale_kind", "variant", "interpret", "bm", "bn"))
def grouped_block_scaled_matmul(x, sx, w, sw, group_sizes, global_scale=None, *, block_size: int,
                                scale_kind: str, variant: str = common.PORTABLE,
                                interpret: bool | None = None, bm: int | None = None,
                                bn: int | None = None) -> jax.Array:
    """Ragged block-scaled matmul -> float32 [M, N]; see the module docstring."""
    common.check_variant(variant)
    for name, arr, rank in (("x", x, 2), ("sx", sx, 2), ("w", w, 3), ("sw", sw, 3), ("group_sizes", group_sizes, 1)):
        if arr.ndim != rank:
            raise ValueError(f"{name} must have rank {rank}, got shape {arr.shape}")
    m, k = x.shape
    g, _, n = w.shape
    if w.shape[1] != k or k % block_size:
        raise ValueError(f"w {w.shape} must be [G, {k}, N] with K a multiple of {block_size}")
    kb = k // block_size
    if sx.shape != (m, kb) or sw.shape != (g, kb, n) or group_sizes.shape != (g,):
        raise ValueError(f"scale/group shapes {sx.shape}, {sw.shape}, {group_sizes.shape} do not match "
                         f"x {x.shape}, w {w.shape} (want {(m, kb)}, {(g, kb, n)}, {(g,)})")
    interpret = common.default_interpret() if interpret is None else interpret
    if variant == common.TPU:
        return grouped_matmul_tpu.grouped_matmul(x, sx, w, sw, group_sizes, global_scale, block_size=block_size,
                                                 scale_kind=scale_kind, interpret=interpret)
    if variant == common.BLACKWELL:
        from pallas_kernels import grouped_matmul_blackwell  # Mosaic GPU: only for that variant

        return grouped_matmul_blackwell.grouped_matmul(x, sx, w, sw, group_sizes, global_scale,
                                                       block_size=block_size, scale_kind=scale_kind,
                                                       interpret=interpret)
    bm = bm or common.pow2_tile(m, 64, 16)
    bn = bn or common.pow2_tile(n, 128, 16)
    mp, np_ = common.round_up(m, bm), common.round_up(n, bn)
    rows = common.row_groups(group_sizes, mp)
    lo, hi = common.tile_group_ranges(rows, bm, g)
    x, sx = common.pad_to(x, (mp, k)), common.pad_to(sx, (mp, kb))
    w, sw = common.pad_to(w, (g, k, np_)), common.pad_to(sw, (g, kb, np_))
    kernel = functools.partial(_kernel, bs=block_size, kb=kb, kind=scale_kind,
                               mma_kind=mma_kind(variant, block_size))
    tile = pl.BlockSpec((1, 1), lambda i, j: (i, 0))
    out = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((mp, np_), jnp.float32), grid=(mp // bm, np_ // bn),
        in_specs=[tile, tile, pl.BlockSpec((bm, 1), lambda i, j: (i, 0)),
                  pl.BlockSpec((bm, k), lambda i, j: (i, 0)), pl.BlockSpec((bm, kb), lambda i, j: (i, 0)),
                  pl.BlockSpec((g, k, bn), lambda i, j: (0, 0, j)), pl.BlockSpec((g, kb, bn), lambda i, j: (0, 0, j)),
                  pl.BlockSpec((1, 1), lambda i, j: (0, 0))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        interpret=interpret, name=f"grouped_block_scaled_matmul_{variant}",
    )(lo, hi, rows[:, None], x, sx, w, sw, common.global_scale_arg(global_scale))
    return out[:m, :n]
