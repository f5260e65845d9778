"""Reference block-scaled GEMMs with an explicit accumulation order (the kernels' contract).

out = sum over K blocks kb, in increasing order, of (A[:, kb] @ B[kb, :]) * sA[:, kb] * sB[kb, :]
in float32, times gA * gB at the end for NVFP4. The Pallas kernels follow exactly this order, so
they are compared with these functions bit for bit. (The training path's jnp backend instead
dequantizes and runs one float32 dot: same math, different summation order.)

Glossary: M rows of A, K contraction, N columns of B, G groups (experts), KB = K / block size.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from composer_jax.errors import ConfigError
from composer_jax.quant.qarray import QArray
from composer_jax.quant.quantize import scale_values


def lhs_operand(q: QArray) -> tuple[jax.Array, jax.Array]:
    """A as (values [M, K] f32, scale multipliers [M, KB] f32); A must be blocked along its last axis."""
    if q.ndim != 2 or q.axes != (1,):
        raise ConfigError(f"lhs must be a 2-D QArray blocked along axis 1, got axes {q.axes} of rank {q.ndim}")
    return q.data.astype(jnp.float32), scale_values(q)


def rhs_operand(q: QArray) -> tuple[jax.Array, jax.Array]:
    """B as (values [..., K, N] f32, scale multipliers [..., KB, N] f32).

    B must be blocked along K (axis -2) or in 16x16 tiles (NVFP4 weights: tile scales are
    repeated along N so every column sees its tile's scale).
    """
    if q.ndim < 2 or q.axes not in ((q.ndim - 2,), (q.ndim - 2, q.ndim - 1)):
        raise ConfigError(f"rhs must be blocked along its K axis (-2) or in 2-D tiles, got axes {q.axes}")
    s = scale_values(q)
    if q.is_2d:
        s = jnp.repeat(s, q.block_size, axis=-1)
    return q.data.astype(jnp.float32), s


def global_product(qa: QArray, qb: QArray) -> jax.Array | None:
    """gA * gB for NVFP4 operands, else None."""
    if (qa.global_scale is None) != (qb.global_scale is None):
        raise ConfigError("both operands must be in the same format")
    return None if qa.global_scale is None else qa.global_scale * qb.global_scale


def _accumulate(a, sa, b, sb, bs: int) -> jax.Array:
    """Sequential K-block accumulation; a [M, K], sa [M, KB], b [K, N], sb [KB, N] -> [M, N] f32."""
    m, k = a.shape
    kb = k // bs
    ab = jnp.moveaxis(a.reshape(m, kb, bs), 1, 0)
    bb = b.reshape(kb, bs, -1)

    def step(acc, xs):
        a_blk, sa_blk, b_blk, sb_blk = xs
        part = jnp.dot(a_blk, b_blk, preferred_element_type=jnp.float32, precision=lax.Precision.HIGHEST)
        return acc + part * sa_blk[:, None] * sb_blk[None, :], None

    acc0 = jnp.zeros((m, b.shape[-1]), jnp.float32)
    out, _ = lax.scan(step, acc0, (ab, sa.T, bb, sb))
    return out


def _check_pair(qa: QArray, qb: QArray) -> None:
    if qa.fmt != qb.fmt:
        raise ConfigError(f"operands have different formats {qa.fmt!r} and {qb.fmt!r}")
    if qa.shape[-1] != qb.shape[-2]:
        raise ConfigError(f"contraction sizes differ: lhs {qa.shape}, rhs {qb.shape}")


def block_scaled_matmul(qa: QArray, qb: QArray) -> jax.Array:
    """Reference (A, sA) @ (B, sB): qa [M, K] blocked along K, qb [K, N] blocked along K -> f32 [M, N]."""
    _check_pair(qa, qb)
    a, sa = lhs_operand(qa)
    b, sb = rhs_operand(qb)
    out = _accumulate(a, sa, b, sb, qa.block_size)
    g = global_product(qa, qb)
    return out if g is None else out * g


def group_ids(group_sizes: jax.Array, m: int) -> jax.Array:
    """Group index of each of m rows for consecutive groups of `group_sizes` [G]; rows past the end get G."""
    ends = jnp.cumsum(group_sizes.astype(jnp.int32))
    return jnp.searchsorted(ends, jnp.arange(m, dtype=jnp.int32), side="right").astype(jnp.int32)


def grouped_block_scaled_matmul(qa: QArray, qb: QArray, group_sizes: jax.Array) -> jax.Array:
    """Reference ragged block-scaled GEMM (jax.lax.ragged_dot semantics).

    qa [M, K] blocked along K; qb [G, K, N] blocked along K (or 16x16 tiles); group_sizes [G] int.
    Row m of the output is A[m] @ B[g(m)] for the group g(m) holding it; rows past sum(group_sizes)
    are zero. Returns f32 [M, N].
    """
    _check_pair(qa, qb)
    if qb.ndim != 3 or group_sizes.shape != (qb.shape[0],):
        raise ConfigError(f"grouped matmul wants rhs [G, K, N] and group_sizes [G], got {qb.shape}, {group_sizes.shape}")
    a, sa = lhs_operand(qa)
    b, sb = rhs_operand(qb)
    gid = group_ids(group_sizes, a.shape[0])

    def one_group(acc, xs):
        g, b_g, sb_g = xs
        out_g = _accumulate(a, sa, b_g, sb_g, qa.block_size)
        return jnp.where((gid == g)[:, None], out_g, acc), None

    acc0 = jnp.zeros((a.shape[0], b.shape[-1]), jnp.float32)
    out, _ = lax.scan(one_group, acc0, (jnp.arange(b.shape[0], dtype=jnp.int32), b, sb))
    g = global_product(qa, qb)
    return out if g is None else out * g
