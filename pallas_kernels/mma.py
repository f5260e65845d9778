"""The per-scale-block MMA step shared by the block-scaled kernels.

partial = A_blk @ B_blk in float32 (exact products: every E4M3/E2M1 product fits float32), then
acc + partial * sA * sB, in that order (the reference's order; only the f32 sums inside the block's
dot may run in another order, which XLA leaves to the backend).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from pallas_kernels import tile_math

# How each variant feeds the matrix unit. All are exact conversions of E4M3/E2M1 values:
# "f32" (portable), "native" (fp8 operands straight into the fp8 MMA: Hopper wgmma),
# "f16" (Mosaic GPU/Triton path that avoids fp8->bf16 casts, and NVFP4's 16-wide K on Hopper),
# "bf16" (TPU MXU).
MMA_DTYPES = {"f32": jnp.float32, "f16": jnp.float16, "bf16": jnp.bfloat16, "native": None}


def block_dot(a_blk: jax.Array, b_blk: jax.Array, mma: str) -> jax.Array:
    """[bm, bs] @ [bs, bn] -> float32 [bm, bn] with operands converted per `mma`."""
    dtype = MMA_DTYPES[mma]
    if dtype is not None:
        if dtype != jnp.float32:
            a_blk, b_blk = a_blk.astype(jnp.float32), b_blk.astype(jnp.float32)
        a_blk, b_blk = a_blk.astype(dtype), b_blk.astype(dtype)
    # Narrow operands: one native pass is exact (float32 accumulation of exact products), and
    # Mosaic rejects a float32 contract precision on bf16 operands, which the global default
    # (JAX_DEFAULT_MATMUL_PRECISION=highest) would otherwise request.
    precision = None if dtype == jnp.float32 else lax.Precision.DEFAULT
    return jnp.dot(a_blk, b_blk, precision=precision, preferred_element_type=jnp.float32)


def rescale_add(acc: jax.Array, partial: jax.Array, sa_col: jax.Array, sb_row: jax.Array) -> jax.Array:
    """acc + partial * sA[:, None] * sB[None, :] with sa_col [bm, 1], sb_row [1, bn] (float32)."""
    return acc + partial * sa_col * sb_row


def accumulate_k(load_a, load_sa, load_b, load_sb, *, kb: int, shape, kind: str, mma_kind: str) -> jax.Array:
    """Sequential loop over kb scale blocks: acc = sum_k rescale(load_a(k) @ load_b(k)).

    load_a(k) -> [bm, bs], load_b(k) -> [bs, bn], load_sa(k) -> [bm, 1], load_sb(k) -> [1, bn]
    (raw scale tiles, decoded per `kind`). Returns float32 `shape` = [bm, bn].
    """
    def body(k, acc):
        sa = tile_math.scale_value(load_sa(k), kind)
        sb = tile_math.scale_value(load_sb(k), kind)
        return rescale_add(acc, block_dot(load_a(k), load_b(k), mma_kind), sa, sb)

    return lax.fori_loop(0, kb, body, jnp.zeros(shape, jnp.float32))
