"""Multi-head latent attention (MLA, DeepSeek-V2/V3) and the pure attention core.

q: low-rank (x @ wq_a -> RMSNorm -> @ wq_b) or plain (x @ wq) when q_lora_rank == 0, split per head
into a no-position part (qk_nope) and a rotary part (qk_rope).
kv: x @ wkv_a gives a compressed latent c (kv_lora) and ONE rotary key k_pe (qk_rope) shared by
all heads; RMSNorm(c) @ wkv_b gives per-head k_nope and v. Softmax scale is
qk_head_dim^-1/2 times the YaRN multiplier (rope.softmax_scale_multiplier).

Shape glossary: B batch, T query tokens, S key tokens, H heads, C kv_lora rank, R rope dims,
N qk_nope dims, Dv v_head dim, D model dim.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from composer_jax.config import ModelConfig
from composer_jax.model import rope as rope_lib
from composer_jax.model.layers import Ctx, RMSNorm, linear, make_param
from composer_jax.parallel.ring_attention import online_softmax_block, ring_attention
from composer_jax.parallel.sharding import CPAttention, current, shard


def attention_mask(q_segment: jax.Array, kv_segment: jax.Array, q_index: jax.Array,
                   kv_index: jax.Array) -> jax.Array:
    """Causal, same-document mask [B, T, S] from segment ids and global token indices.

    A query attends to keys at an index <= its own and in the same segment (packing).
    """
    causal = kv_index[:, None, :] <= q_index[:, :, None]
    same_doc = q_segment[:, :, None] == kv_segment[:, None, :]
    return causal & same_doc


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float) -> jax.Array:
    """Softmax attention. q [B,T,H,Dk], k [B,S,H,Dk], v [B,S,H,Dv], mask [B,T,S] -> [B,T,H,Dv].

    Logits and softmax in float32; fully masked rows (cannot happen with causal masks) give zeros.
    """
    logits = jnp.einsum("bthd,bshd->bhts", q, k, preferred_element_type=jnp.float32) * scale
    logits = jnp.where(mask[:, None], logits, -1e30)
    probs = jax.nn.softmax(logits, axis=-1)
    out = jnp.einsum("bhts,bshd->bthd", probs.astype(v.dtype), v,
                     preferred_element_type=jnp.float32)
    return out.astype(v.dtype)


# The q and kv latent norms use a fixed epsilon in the DeepSeek-V3 reference code and in HF
# transformers, whatever rms_norm_eps says.
LATENT_NORM_EPS = 1e-6


def attend_blocked(q, k, v, q_segment, kv_segment, q_index, kv_index, scale: float,
                   kv_block: int) -> jax.Array:
    """Memory-efficient exact attention: keys in blocks of `kv_block` with an online softmax, each
    block step checkpointed, so neither pass holds more than one [B,H,T,kv_block] score block.

    q [B,T,H,Dk], k [B,S,H,Dk], v [B,S,H,Dv], segments/indices as in `attention_mask`.
    """
    b, s_len = k.shape[:2]
    nk = -(-s_len // kv_block)
    pad = nk * kv_block - s_len
    if pad:
        k = jnp.pad(k, ((0, 0), (0, pad), (0, 0), (0, 0)))
        v = jnp.pad(v, ((0, 0), (0, pad), (0, 0), (0, 0)))
        kv_segment = jnp.pad(kv_segment, ((0, 0), (0, pad)), constant_values=-1)
        kv_index = jnp.pad(kv_index, ((0, 0), (0, pad)))
    blocks = lambda x: jnp.moveaxis(x.reshape((b, nk, kv_block) + x.shape[2:]), 1, 0)  # noqa: E731
    t, h = q.shape[1], q.shape[2]
    zq = jnp.zeros((b, t, h), jnp.float32)
    o = jnp.zeros((b, t, h, v.shape[-1]), jnp.float32)
    m = jnp.moveaxis(zq, 1, 2) - 1e30
    l = jnp.moveaxis(zq, 1, 2)
    step_fn = jax.checkpoint(online_softmax_block, static_argnums=(4,))

    def step(carry, xs):
        kb, vb, segb, idxb = xs
        mask = attention_mask(q_segment, segb, q_index, idxb)
        return step_fn(q, kb, vb, mask, scale, *carry), None

    (o, m, l), _ = jax.lax.scan(step, (o, m, l),
                                (blocks(k), blocks(v), blocks(kv_segment), blocks(kv_index)))
    l = jnp.moveaxis(jnp.where(l > 0, l, 1.0), 1, 2)[..., None]
    return (o / l).astype(v.dtype)


class MLA(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, stack: tuple[int, ...] = ()):
        d, h = cfg.hidden_size, cfg.num_heads
        if cfg.q_lora_rank > 0:
            self.wq_a = make_param(rngs, (d, cfg.q_lora_rank), ("embed", "q_lora"), cfg, stack)
            self.q_norm = RMSNorm(cfg.q_lora_rank, cfg, stack, eps=LATENT_NORM_EPS)
            self.wq_b = make_param(rngs, (cfg.q_lora_rank, h, cfg.qk_head_dim),
                                   ("q_lora", "heads", "head_dim"), cfg, stack)
        else:
            self.wq = make_param(rngs, (d, h, cfg.qk_head_dim), ("embed", "heads", "head_dim"),
                                 cfg, stack)
        self.wkv_a = make_param(rngs, (d, cfg.kv_lora_rank + cfg.qk_rope_head_dim),
                                ("embed", "kv_lora"), cfg, stack)
        self.kv_norm = RMSNorm(cfg.kv_lora_rank, cfg, stack, eps=LATENT_NORM_EPS)
        self.wkv_b = make_param(rngs, (cfg.kv_lora_rank, h, cfg.qk_nope_head_dim + cfg.v_head_dim),
                                ("kv_lora", "heads", "head_dim"), cfg, stack)
        self.wo = make_param(rngs, (h, cfg.v_head_dim, d), ("heads", "head_dim", "embed"), cfg,
                             stack)

    def project_q(self, x, ctx: Ctx):
        """x [B,T,D] -> q_nope [B,T,H,N], q_pe [B,T,H,R] (rope not yet applied)."""
        cfg = ctx.cfg
        if cfg.q_lora_rank > 0:
            q = linear(self.q_norm(linear(x, self.wq_a[...], ctx)), self.wq_b[...], ctx,
                       "btc,chd->bthd")
        else:
            q = linear(x, self.wq[...], ctx, "btd,dhk->bthk")
        return q[..., :cfg.qk_nope_head_dim], q[..., cfg.qk_nope_head_dim:]

    def project_latent(self, x, ctx: Ctx):
        """x [B,T,D] -> normalised latent c [B,T,C] and the shared rope key k_pe [B,T,R]."""
        kv = linear(x, self.wkv_a[...], ctx)
        c, k_pe = kv[..., :ctx.cfg.kv_lora_rank], kv[..., ctx.cfg.kv_lora_rank:]
        return self.kv_norm(c), k_pe

    def expand_latent(self, c, ctx: Ctx):
        """Latent c [B,S,C] -> k_nope [B,S,H,N], v [B,S,H,Dv]."""
        kv = linear(c, self.wkv_b[...], ctx, "bsc,chd->bshd")
        return kv[..., :ctx.cfg.qk_nope_head_dim], kv[..., ctx.cfg.qk_nope_head_dim:]

    def __call__(self, x, positions, segment_ids, ctx: Ctx, token_index=None):
        """x [B,T,D], positions/segment_ids [B,T] -> [B,T,D] (causal, packed).

        token_index [B,T]: each token's index in the original sequence (the causal order); default
        arange(T). Context parallelism passes it because it feeds tokens in load-balanced order.
        Under a parallel context the sequence may be split over `context`: the compressed latent and
        shared rope key are all-gathered (default) or K/V pass around a ring (mesh.cp_attention).
        """
        cfg = ctx.cfg
        inv_freq, att_factor = rope_lib.rope_frequencies(cfg.rope, cfg.qk_rope_head_dim)
        cos, sin = rope_lib.rope_cos_sin(positions, inv_freq, att_factor)
        q_nope, q_pe = self.project_q(x, ctx)
        q_pe = rope_lib.apply_rope(q_pe, cos, sin, cfg.rope.interleaved)
        q = shard(jnp.concatenate([q_nope, q_pe], axis=-1), ("batch", "seq", "act_heads", None))
        c, k_pe = self.project_latent(x, ctx)
        k_pe = rope_lib.apply_rope(k_pe[:, :, None, :], cos, sin, cfg.rope.interleaved)
        if token_index is None:
            token_index = jnp.broadcast_to(jnp.arange(x.shape[1]), x.shape[:2])
        scale = softmax_scale(cfg)
        pc = current()
        if pc is not None and pc.context_parallel > 1 and pc.cp_attention == CPAttention.RING:
            k_nope, v = self.expand_latent(c, ctx)
            k = jnp.concatenate([k_nope, jnp.broadcast_to(k_pe, k_nope.shape[:-1]
                                                          + (k_pe.shape[-1],))], axis=-1)
            out = ring_attention(q, k, v, segment_ids, token_index, scale, pc)
        else:
            # All-gather over the sequence shards only the latent (C) and rope key (R) per token.
            c = shard(c, ("batch", "kv_seq", "act_kv"))
            k_pe = shard(k_pe, ("batch", "kv_seq", None, "act_k"))
            kv_index = shard(token_index, ("batch", "kv_seq"))
            kv_segment = shard(segment_ids, ("batch", "kv_seq"))
            k_nope, v = self.expand_latent(c, ctx)
            k = jnp.concatenate([k_nope, jnp.broadcast_to(k_pe, k_nope.shape[:-1]
                                                          + (k_pe.shape[-1],))], axis=-1)
            if k.shape[1] > cfg.attention_kv_block:
                out = attend_blocked(q, k, v, segment_ids, kv_segment, token_index, kv_index,
                                     scale, cfg.attention_kv_block)
            else:
                mask = attention_mask(segment_ids, kv_segment, token_index, kv_index)
                out = attend(q, k, v, mask, scale)
        out = shard(out, ("batch", "seq", "act_heads", None))
        return linear(out, self.wo[...], ctx, "bthv,hvd->btd")


def softmax_scale(cfg: ModelConfig) -> float:
    return rope_lib.softmax_scale_multiplier(cfg.rope) / math.sqrt(cfg.qk_head_dim)
