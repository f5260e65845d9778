"""Exact attention across context shards: ring passing of K/V blocks with an online softmax.

Inside `jax.shard_map` each context shard keeps its queries and, over cp steps, attends to the K/V
block it currently holds, then passes that block (with its segment ids and global token indices) to
the next shard (`ppermute`). Running max m, normaliser l and un-normalised output o are merged
step by step (online softmax), so the result equals full attention. Masks come from global token
indices and segment ids, so any token order (load-balanced) and packing work.

Shape glossary: B batch, T local queries, S local keys, H heads, Dk/Dv head dims.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from composer_jax.errors import ConfigError
from composer_jax.parallel.sharding import ParallelContext

_NEG = -1e30


def online_softmax_block(q, k, v, mask, scale, o, m, l):
    """One key block of an online softmax: merges q [B,T,H,Dk] . k [B,S,H,Dk] (mask [B,T,S]) into
    the running un-normalised output o [B,T,H,Dv], max m [B,H,T] and normaliser l [B,H,T]."""
    s = jnp.einsum("bthd,bshd->bhts", q, k, preferred_element_type=jnp.float32) * scale
    s = jnp.where(mask[:, None], s, _NEG)
    m_new = jnp.maximum(m, s.max(-1))                                    # [B,H,T]
    p = jnp.where(mask[:, None], jnp.exp(s - m_new[..., None]), 0.0)
    corr = jnp.exp(m - m_new)
    l = l * corr + p.sum(-1)
    pv = jnp.einsum("bhts,bshd->bthd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    o = o * jnp.moveaxis(corr, 1, 2)[..., None] + pv
    return o, m_new, l


def _ring_local(q, k, v, q_seg, kv_seg, q_idx, kv_idx, *, scale, axis):
    n = jax.lax.axis_size(axis)
    perm = [(i, (i + 1) % n) for i in range(n)]
    b, t, h, _ = q.shape
    # Carries built from q so they vary over the same manual mesh axes as q (shard_map typing).
    zq = jnp.zeros_like(q[..., 0], jnp.float32)                         # [B,T,H]
    o = jnp.zeros((b, t, h, v.shape[-1]), jnp.float32) + zq[..., None]
    m = jnp.moveaxis(zq, 1, 2) + _NEG
    l = jnp.moveaxis(zq, 1, 2)

    def step(carry, _):
        k, v, kv_seg, kv_idx, o, m, l = carry
        mask = (kv_idx[:, None, :] <= q_idx[:, :, None]) & (q_seg[:, :, None] == kv_seg[:, None, :])
        # checkpointed: the backward pass recomputes this step's scores instead of keeping all cp
        # steps' [B,H,T,S] score blocks alive
        o, m, l = jax.checkpoint(online_softmax_block, static_argnums=(4,))(q, k, v, mask, scale,
                                                                           o, m, l)
        k, v, kv_seg, kv_idx = (jax.lax.ppermute(a, axis, perm) for a in (k, v, kv_seg, kv_idx))
        return (k, v, kv_seg, kv_idx, o, m, l), None

    (_, _, _, _, o, m, l), _ = jax.lax.scan(step, (k, v, kv_seg, kv_idx, o, m, l), None, length=n)
    l = jnp.moveaxis(jnp.where(l > 0, l, 1.0), 1, 2)[..., None]
    return (o / l).astype(v.dtype)


def ring_attention(q, k, v, segment_ids, token_index, scale: float, pc: ParallelContext):
    """q [B,T,H,Dk], k [B,T,H,Dk], v [B,T,H,Dv], segment_ids/token_index [B,T] (global arrays,
    sequence split over the context axis) -> [B,T,H,Dv], equal to full causal packed attention."""
    seq_axes = pc.axes_of("seq")
    if len(seq_axes) != 1:
        raise ConfigError(f"ring attention needs the sequence on exactly one mesh axis, rules "
                          f"{pc.rules.name!r} put it on {seq_axes}")
    batch, heads = pc.axes_of("batch") or None, pc.axes_of("act_heads") or None
    tok = P(batch, seq_axes[0], heads, None)
    idx = P(batch, seq_axes[0])
    fn = jax.shard_map(lambda *a: _ring_local(*a, scale=scale, axis=seq_axes[0]),
                       in_specs=(tok, tok, tok, idx, idx, idx, idx), out_specs=tok)
    return fn(q, k, v, segment_ids, segment_ids, token_index, token_index)
