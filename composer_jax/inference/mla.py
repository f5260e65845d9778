"""Cached multi-head latent attention: new tokens attend over the latent cache.

Absorbed form (decode): instead of expanding every cached latent into per-head keys and values,
q_nope is absorbed through the key half of wkv_b (q_lat = q_nope . W_uk, [B,T,H,C]) and scores are
q_lat . c + q_pe . k_pe; the attention output stays in latent space (o_lat = probs . c) and goes
through the value half of wkv_b and then wo. The naive form (expand c with wkv_b, then ordinary
attention) is kept as the reference and as an option.

Shape glossary: B batch, T new tokens, S cache length, H heads, C kv_lora rank, R rope dims,
N qk_nope dims, Dv v_head dim, D model dim.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from composer_jax.model import rope as rope_lib
from composer_jax.model.attention import MLA, attend, softmax_scale
from composer_jax.model.layers import Ctx, linear
from composer_jax.inference.cache import write_layer


def cache_mask(positions: jax.Array, max_len: int) -> jax.Array:
    """[B,T,S]: a query at sequence position p sees cache positions <= p."""
    return jnp.arange(max_len)[None, None, :] <= positions[:, :, None]


def absorbed_attention(q_nope, q_pe, c, k_pe, wkv_b, mask, scale: float, ctx: Ctx):
    """q_nope [B,T,H,N], q_pe [B,T,H,R] (rope'd), c [B,S,C], k_pe [B,S,R] (rope'd),
    wkv_b [C,H,N+Dv], mask [B,T,S] -> per-head outputs [B,T,H,Dv] (before wo).

    The latent cache is shared by every head, so the T*H query rows of a sequence go through one
    batched matmul against it ([B, T*H, C] x [B, S, C]; row t*H + h): on CPU, at decode (T = 1)
    that took a third of the time of per-head einsums that put H between T and S."""
    dt = ctx.dtype
    b, t, h, n = q_nope.shape
    w_uk, w_uv = wkv_b[..., :n], wkv_b[..., n:]
    q_lat = linear(q_nope, w_uk, ctx, "bthn,chn->bthc")
    rows = t * h
    batched = (((2,), (2,)), ((0,), (0,)))                    # contract the feature, batch B

    def scores(q, kv):
        return jax.lax.dot_general(q.reshape(b, rows, -1).astype(dt), kv.astype(dt), batched,
                                   preferred_element_type=jnp.float32)
    logits = (scores(q_lat, c) + scores(q_pe, k_pe)) * scale              # [B, T*H, S]
    logits = jnp.where(jnp.repeat(mask, h, axis=1), logits, -1e30)
    probs = jax.nn.softmax(logits, axis=-1)
    o_lat = jax.lax.dot_general(probs.astype(dt), c.astype(dt), (((2,), (1,)), ((0,), (0,))),
                                preferred_element_type=jnp.float32).astype(dt)
    return linear(o_lat.reshape(b, t, h, -1), w_uv, ctx, "bthc,chv->bthv")


def naive_attention(attn: MLA, q_nope, q_pe, c, k_pe, mask, scale: float, ctx: Ctx):
    """Same contract as `absorbed_attention`, by expanding the cached latents (reference)."""
    k_nope, v = attn.expand_latent(c.astype(ctx.dtype), ctx)
    k_rope = jnp.broadcast_to(k_pe[:, :, None, :].astype(k_nope.dtype),
                              k_nope.shape[:-1] + (k_pe.shape[-1],))
    q = jnp.concatenate([q_nope, q_pe.astype(q_nope.dtype)], axis=-1)
    return attend(q, jnp.concatenate([k_nope, k_rope], axis=-1), v, mask, scale)


def mla_cached(attn: MLA, x, positions, write_pos, c_cache, kpe_cache, ctx: Ctx,
               absorbed: bool = True):
    """One MLA layer over new tokens with a cache.

    x [B,T,D] (normed), positions [B,T] (sequence positions of the new tokens), write_pos [B,T]
    (= positions, or >= S for padding), c_cache [B,S,C], kpe_cache [B,S,R]
    -> (out [B,T,D], c_cache, kpe_cache) with the new tokens' latents written.
    """
    cfg = ctx.cfg
    inv_freq, att_factor = rope_lib.rope_frequencies(cfg.rope, cfg.qk_rope_head_dim)
    cos, sin = rope_lib.rope_cos_sin(positions, inv_freq, att_factor)
    q_nope, q_pe = attn.project_q(x, ctx)
    q_pe = rope_lib.apply_rope(q_pe, cos, sin, cfg.rope.interleaved)
    c, k_pe = attn.project_latent(x, ctx)
    k_pe = rope_lib.apply_rope(k_pe[:, :, None, :], cos, sin, cfg.rope.interleaved)[:, :, 0]
    c_cache, kpe_cache = write_layer(c_cache, kpe_cache, c, k_pe, write_pos)
    mask = cache_mask(positions, c_cache.shape[1])
    scale = softmax_scale(cfg)
    if absorbed:
        out = absorbed_attention(q_nope, q_pe, c_cache, kpe_cache, attn.wkv_b[...], mask, scale, ctx)
    else:
        out = naive_attention(attn, q_nope, q_pe, c_cache, kpe_cache, mask, scale, ctx)
    return linear(out, attn.wo[...], ctx, "bthv,hvd->btd"), c_cache, kpe_cache
