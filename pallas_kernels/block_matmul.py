"""Block-scaled matmul (A, sA) @ (B, sB) with float32 accumulation and per-K-block scales.

Glossary: M rows, K contraction, N columns, bs scale block (32 MXFP8, 16 NVFP4), KB = K / bs,
bm/bn output tile. Inputs: a [M, K] and b [K, N] as float8_e4m3fn (NVFP4's E2M1 values are
stored in E4M3, exactly), sa [M, KB], sb [KB, N] as E8M0 bytes (uint8) or E4M3 (see `scale_kind`),
optional FP32 global scale (gA * gB, applied once at the end). Output float32 [M, N].

M and N are padded up to the tile sizes and the result is sliced back; K is never tiled past its
end (the loop runs over exactly KB scale blocks).
Variants: "portable" (f32 MMA; the interpret-mode reference kernel), "hopper" (fp8 MMA per
32-wide K block with the rescale on CUDA cores; f16 MMA for NVFP4's 16-wide blocks), "blackwell"
(native block-scaled tcgen05 MMA, see block_matmul_blackwell), "tpu" (see block_matmul_tpu).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels import common, mma


def _kernel(a_ref, sa_ref, b_ref, sb_ref, g_ref, o_ref, *, bs: int, kb: int, kind: str, mma_kind: str):
    acc = mma.accumulate_k(
        lambda k: a_ref[:, pl.ds(k * bs, bs)], lambda k: sa_ref[:, pl.ds(k, 1)],
        lambda k: b_ref[pl.ds(k * bs, bs), :], lambda k: sb_ref[pl.ds(k, 1), :],
        kb=kb, shape=o_ref.shape, kind=kind, mma_kind=mma_kind)
    o_ref[...] = acc * g_ref[0, 0]


def check_operands(a, sa, b, sb, block_size: int) -> tuple[int, int, int, int]:
    """Validate shapes; returns (M, K, N, KB)."""
    for name, x in (("a", a), ("sa", sa), ("b", b), ("sb", sb)):
        common.check_2d(name, x)
    m, k = a.shape
    n = b.shape[1]
    if b.shape[0] != k:
        raise ValueError(f"contraction sizes differ: a {a.shape}, b {b.shape}")
    if k % block_size:
        raise ValueError(f"K={k} is not a multiple of the scale block size {block_size}")
    kb = k // block_size
    if sa.shape != (m, kb) or sb.shape != (kb, n):
        raise ValueError(f"scale shapes {sa.shape}, {sb.shape} do not match a {a.shape}, b {b.shape} "
                         f"with block size {block_size} (want {(m, kb)}, {(kb, n)})")
    return m, k, n, kb


def mma_kind(variant: str, block_size: int) -> str:
    """MMA operand type for a GPU/portable variant (see mma.MMA_DTYPES)."""
    if variant == common.HOPPER:
        return "native" if block_size >= 32 else "f16"
    return "f32"


@functools.partial(jax.jit, static_argnames=("block_size", "scale_kind", "variant", "interpret", "bm", "bn"))
def block_scaled_matmul(a, sa, b, sb, global_scale=None, *, block_size: int, scale_kind: str,
                        variant: str = common.PORTABLE, interpret: bool | None = None,
                        bm: int | None = None, bn: int | None = None) -> jax.Array:
    """(a, sa) @ (b, sb) -> float32 [M, N]; see the module docstring for shapes and variants."""
    common.check_variant(variant)
    m, k, n, kb = check_operands(a, sa, b, sb, block_size)
    interpret = common.default_interpret() if interpret is None else interpret
    if variant == common.TPU:
        from pallas_kernels import block_matmul_tpu  # Mosaic TPU: loaded only for that variant

        return block_matmul_tpu.matmul(a, sa, b, sb, global_scale, block_size=block_size,
                                       scale_kind=scale_kind, interpret=interpret)
    if variant == common.BLACKWELL:
        from pallas_kernels import block_matmul_blackwell  # Mosaic GPU: only for that variant

        return block_matmul_blackwell.matmul(a, sa, b, sb, global_scale, block_size=block_size,
                                             scale_kind=scale_kind, interpret=interpret)
    bm = bm or common.pow2_tile(m, 64, 16)
    bn = bn or common.pow2_tile(n, 128, 16)
    mp, np_ = common.round_up(m, bm), common.round_up(n, bn)
    a, sa = common.pad_to(a, (mp, k)), common.pad_to(sa, (mp, kb))
    b, sb = common.pad_to(b, (k, np_)), common.pad_to(sb, (kb, np_))
    kernel = functools.partial(_kernel, bs=block_size, kb=kb, kind=scale_kind,
                               mma_kind=mma_kind(variant, block_size))
    in_specs = [pl.BlockSpec((bm, k), lambda i, j: (i, 0)), pl.BlockSpec((bm, kb), lambda i, j: (i, 0)),
                pl.BlockSpec((k, bn), lambda i, j: (0, j)), pl.BlockSpec((kb, bn), lambda i, j: (0, j))]
    args = [a, sa, b, sb, common.global_scale_arg(global_scale)]
    in_specs.append(pl.BlockSpec((1, 1), lambda i, j: (0, 0)))
    out = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((mp, np_), jnp.float32), grid=(mp // bm, np_ // bn),
        in_specs=in_specs, out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        interpret=interpret, name=f"block_scaled_matmul_{variant}")(*args)
    return out[:m, :n]
