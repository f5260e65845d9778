"""Multi-head latent attention (MLA, DeepSeek-V2/V3) and the pure attention core.

q: low-rank (x @ wq_a -> RMSNorm -> @ wq_b) or plain (x @ wq) when q_lora_rank == 0, split per head
into a no-position part (qk_nope) and a rotary part (qk_rope).
kv: x @ wkv_a gives a compressed latent c (kv_lora) and ONE rotary key k_pe (qk_rope) shared by
all heads; RMSNorm(c) @ wkv_b gives per-head k_nope and v. Softmax scale is
qk_head_dim^-1/2 times the YaRN multiplier (rope.softmax_scale_multiplier).

Long key ranges (S > execution.attention_kv_block) use `flash_attention`: exact, blocked over keys,
with a custom VJP that saves only the output and the log-sum-exp, and for MLA it expands the latent
into per-head K/V one key block at a time (`mla_kv`), so [S, H, Dk] keys never exist. Under context
parallelism the default all-gathers only the latent and the shared rope key inside `jax.shard_map`
(`allgather_latent_attention`); the ring (parallel/ring_attention.py) passes expanded K/V instead.

Shape glossary: B batch, T query tokens, S key tokens, s keys per block, H heads, C kv_lora rank,
R rope dims, N qk_nope dims, Dv v_head dim, D model dim.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from composer_jax.config import ModelConfig
from composer_jax.model import rope as rope_lib
from composer_jax.model.layers import (Ctx, ParamInit, RMSNorm, linear, make_param, save_as,
                                      use_cpu_matmul)
from composer_jax.parallel.ring_attention import online_softmax_block, ring_attention
from composer_jax.parallel.sharding import CPAttention, current, compute_cast, shard


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


def _to_heads(x):
    """[B, L, H, D] -> [B, H, L, D] (a materialised copy)."""
    return jnp.transpose(x, (0, 2, 1, 3))


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def attend_cpu(q, k, v, mask, scale: float):
    """`attend` for float32 on XLA:CPU: the same softmax attention with every matmul in a layout
    XLA:CPU runs as a plain or rhs-transposed batched matmul (heads moved next to the batch by
    small explicit copies of q/k/v, never of the [B,H,T,S] arrays). q [B,T,H,Dk], k [B,S,H,Dk],
    v [B,S,H,Dv], mask [B,T,S] -> [B,T,H,Dv]. Equal to `attend` within float32 rounding."""
    return _attend_cpu_fwd(q, k, v, mask, scale)[0]


def _attend_cpu_fwd(q, k, v, mask, scale):
    qh, kh, vh = _to_heads(q), _to_heads(k), _to_heads(v)
    logits = jnp.einsum("bhtd,bhsd->bhts", qh, kh, preferred_element_type=jnp.float32) * scale
    logits = jnp.where(mask[:, None], logits, -1e30)
    probs = jax.nn.softmax(logits, axis=-1)
    oh = jnp.einsum("bhts,bhsd->bhtd", probs, vh, preferred_element_type=jnp.float32)
    return jnp.transpose(oh, (0, 2, 1, 3)), (qh, kh, vh, probs)


def _attend_cpu_bwd(scale, res, do):
    qh, kh, vh, p = res
    doh = _to_heads(do)
    dp = jnp.einsum("bhtd,bhsd->bhts", doh, vh, preferred_element_type=jnp.float32)
    ds = p * (dp - jnp.sum(p * dp, axis=-1, keepdims=True)) * scale
    dqh = jnp.einsum("bhts,bhsd->bhtd", ds, kh, preferred_element_type=jnp.float32)
    # dk^T = q^T ds and dv^T = do^T p: transposed copies of the thin q / do, not of ds / p
    dkt = jnp.einsum("bhdt,bhts->bhds", jnp.swapaxes(qh, 2, 3), ds,
                     preferred_element_type=jnp.float32)
    dvt = jnp.einsum("bhdt,bhts->bhds", jnp.swapaxes(doh, 2, 3), p,
                     preferred_element_type=jnp.float32)
    return (jnp.transpose(dqh, (0, 2, 1, 3)), jnp.transpose(dkt, (0, 3, 1, 2)),
            jnp.transpose(dvt, (0, 3, 1, 2)), None)


attend_cpu.defvjp(_attend_cpu_fwd, _attend_cpu_bwd)


# The q and kv latent norms use a fixed epsilon in the DeepSeek-V3 reference code and in HF
# transformers, whatever rms_norm_eps says.
LATENT_NORM_EPS = 1e-6


def _pad_blocks(x, nk: int, kv_block: int, value=0):
    """[B, S, ...] -> [nk, B, kv_block, ...] (S padded to nk * kv_block with `value`)."""
    b, s_len = x.shape[:2]
    pad = nk * kv_block - s_len
    if pad:
        x = jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2), constant_values=value)
    return jnp.moveaxis(x.reshape((b, nk, kv_block) + x.shape[2:]), 1, 0)


def _unblock(xb, s_len: int):
    """[nk, B, kv_block, ...] -> [B, S, ...] (padding dropped)."""
    x = jnp.moveaxis(xb, 0, 1)
    return x.reshape((x.shape[0], -1) + x.shape[3:])[:, :s_len]


def identity_kv(params, k, v):
    """`make_kv` for keys and values given directly (no expansion)."""
    del params
    return k, v


_NEG = -1e30


def _scores(q, k, mask, scale):
    """Masked float32 scores [B,H,T,s] of q [B,T,H,Dk] against one key block k [B,s,H,Dk]."""
    s = jnp.einsum("bthd,bshd->bhts", q, k, preferred_element_type=jnp.float32) * scale
    return jnp.where(mask[:, None], s, _NEG)


def _varying(a) -> set:
    """Manual mesh axes (inside `jax.shard_map`) along which `a` may differ; empty elsewhere."""
    return set(getattr(getattr(jax.typeof(a), "mat", None), "varying", ()))


def _vary_like(tree, *refs):
    """`tree` made varying over every manual mesh axis any of `refs` varies over: inside
    `jax.shard_map` a scan's initial carry must have its outputs' type (a no-op elsewhere)."""
    want = set()
    for r in jax.tree.leaves(refs):
        want |= _varying(r)

    def one(a):
        missing = tuple(sorted(want - _varying(a)))
        return jax.lax.pcast(a, missing, to="varying") if missing else a
    return jax.tree.map(one, tree)


def _sum_like(cotangents, primals):
    """Each cotangent psum-med over the manual axes it varies over and its primal does not (the
    gradient of a weight replicated across shards is the sum of every shard's part)."""
    def one(g, a):
        extra = tuple(sorted(_varying(g) - _varying(a)))
        return jax.lax.psum(g, extra) if extra else g
    return jax.tree.map(one, cotangents, primals)


def _block_mask(q, q_seg, kv_seg, q_idx, kv_idx):
    """attention_mask of one key block, tied to q by an optimization barrier: the mask depends
    only on integer inputs, and without the tie partial evaluation (remat, linearize) would
    hoist every block's head-broadcast mask out of the loop and keep them all ([nk,B,H,T,s])."""
    _, q_seg, kv_seg, q_idx, kv_idx = jax.lax.optimization_barrier(
        (q, q_seg, kv_seg, q_idx, kv_idx))
    return attention_mask(q_seg, kv_seg, q_idx, kv_idx)


def _flash_forward(q, kv, params, q_seg, kv_seg, q_idx, kv_idx, make_kv, scale, kv_block):
    """Online-softmax forward over key blocks -> (out [B,T,H,Dv] in v's dtype, lse [B,H,T])."""
    s_len = kv[0].shape[1]
    nk = -(-s_len // kv_block)
    xs = (tuple(_pad_blocks(a, nk, kv_block) for a in kv), _pad_blocks(kv_seg, nk, kv_block, -1),
          _pad_blocks(kv_idx, nk, kv_block))
    b, t, h = q.shape[:3]

    def step(carry, x):
        o, m, l = carry
        kv_b, seg_b, idx_b = x
        k, v = make_kv(params, *kv_b)
        mask = _block_mask(q, q_seg, seg_b, q_idx, idx_b)
        return online_softmax_block(q, k, v, mask, scale, o, m, l), None

    dv = jax.eval_shape(lambda: make_kv(params, *(a[0] for a in xs[0])))[1]
    zq = jnp.zeros((b, h, t), jnp.float32)
    carry = (jnp.zeros((b, t, h, dv.shape[-1]), jnp.float32), zq + _NEG, zq)
    carry = _vary_like(carry, q, kv, params, q_seg, kv_seg, q_idx, kv_idx)
    (o, m, l), _ = jax.lax.scan(step, carry, xs)
    safe = jnp.where(l > 0, l, 1.0)
    out = (o / jnp.moveaxis(safe, 1, 2)[..., None]).astype(dv.dtype)
    lse = jnp.where(l > 0, m + jnp.log(safe), jnp.inf)        # fully masked rows: p = 0
    return out, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9))
def flash_attention(q, kv, params, q_seg, kv_seg, q_idx, kv_idx, make_kv, scale, kv_block):
    """Exact causal, packed attention, memory-efficient in both passes (FlashAttention-style).

    q [B,T,H,Dk]; kv: a tuple of [B,S,...] arrays that `make_kv(params, *kv_block)` turns into
    (k [B,s,H,Dk], v [B,s,H,Dv]) one key block at a time (`identity_kv` for given K/V; the MLA
    latent expansion otherwise, so full-length per-head K/V never exist); q_seg/q_idx [B,T],
    kv_seg/kv_idx [B,S] as in `attention_mask`. The forward keeps a running max/normaliser and
    saves only the output and the log-sum-exp [B,H,T]; the backward recomputes each block's scores
    and probabilities from them. Neither pass holds more than one [B,H,T,kv_block] score block.
    Gradients flow to q, kv and params. -> [B,T,H,Dv] in v's dtype.
    """
    return _flash_forward(q, kv, params, q_seg, kv_seg, q_idx, kv_idx, make_kv, scale,
                          kv_block)[0]


def _flash_fwd(q, kv, params, q_seg, kv_seg, q_idx, kv_idx, make_kv, scale, kv_block):
    out, lse = _flash_forward(q, kv, params, q_seg, kv_seg, q_idx, kv_idx, make_kv, scale,
                              kv_block)
    return out, (q, kv, params, q_seg, kv_seg, q_idx, kv_idx, out, lse)


def _flash_bwd(make_kv, scale, kv_block, res, d_out):
    q, kv, params, q_seg, kv_seg, q_idx, kv_idx, out, lse = res
    s_len = kv[0].shape[1]
    nk = -(-s_len // kv_block)
    xs = (tuple(_pad_blocks(a, nk, kv_block) for a in kv), _pad_blocks(kv_seg, nk, kv_block, -1),
          _pad_blocks(kv_idx, nk, kv_block))
    do = d_out.astype(out.dtype)
    delta = jnp.moveaxis(jnp.sum(do.astype(jnp.float32) * out.astype(jnp.float32), -1), 1, 2)
    # Differentiate make_kv w.r.t. a shard-varying copy of params: each block's weight gradient
    # stays a local partial sum, reduced once at the end (`_sum_like`), not once per block.
    params_v = _vary_like(params, q, kv, q_seg, kv_seg, q_idx, kv_idx, do)

    def step(carry, x):
        dq, dparams = carry
        kv_b, seg_b, idx_b = x
        (k, v), vjp = jax.vjp(lambda p, *a: make_kv(p, *a), params_v, *kv_b)
        mask = _block_mask(q, q_seg, seg_b, q_idx, idx_b)
        p = jnp.where(mask[:, None], jnp.exp(_scores(q, k, mask, scale) - lse[..., None]), 0.0)
        dv = jnp.einsum("bhts,bthd->bshd", p.astype(do.dtype), do,
                        preferred_element_type=jnp.float32)
        dp = jnp.einsum("bthd,bshd->bhts", do, v.astype(do.dtype),
                        preferred_element_type=jnp.float32)
        ds = (p * (dp - delta[..., None]) * scale).astype(q.dtype)        # [B,H,T,s]
        dq = dq + jnp.einsum("bhts,bshd->bthd", ds, k, preferred_element_type=jnp.float32)
        dk = jnp.einsum("bhts,bthd->bshd", ds, q, preferred_element_type=jnp.float32)
        dp_b, *dkv_b = vjp((dk.astype(k.dtype), dv.astype(v.dtype)))
        dparams = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), dparams, dp_b)
        return (dq, dparams), tuple(dkv_b)

    zeros = (jnp.zeros(q.shape, jnp.float32),
             jax.tree.map(lambda a: jnp.zeros(a.shape, jnp.float32), params))
    zeros = _vary_like(zeros, q, kv, params, q_seg, kv_seg, q_idx, kv_idx, do)
    (dq, dparams), dkv = jax.lax.scan(step, zeros, xs)
    dkv = tuple(_unblock(g, s_len).astype(a.dtype) for g, a in zip(dkv, kv))
    dparams = jax.tree.map(lambda g, a: g.astype(a.dtype), dparams, params)
    dq, dkv, dparams = _sum_like((dq.astype(q.dtype), dkv, dparams), (q, kv, params))
    return dq, dkv, dparams, None, None, None, None


flash_attention.defvjp(_flash_fwd, _flash_bwd)


def attend_blocked(q, k, v, q_segment, kv_segment, q_index, kv_index, scale: float,
                   kv_block: int) -> jax.Array:
    """Memory-efficient exact attention over given K/V (`flash_attention` with `identity_kv`).

    q [B,T,H,Dk], k [B,S,H,Dk], v [B,S,H,Dv], segments/indices as in `attention_mask`.
    """
    return flash_attention(q, (k, v), (), q_segment, kv_segment, q_index, kv_index, identity_kv,
                           scale, kv_block)


def mla_kv(n_nope: int, dtype, wkv_b, c, k_pe):
    """`make_kv` for MLA: latent block c [B,s,C] and shared rope key k_pe [B,s,1,R] ->
    k [B,s,H,N+R] (rope key broadcast to every head), v [B,s,H,Dv]. wkv_b [C,H,N+Dv]."""
    kv = jnp.einsum("bsc,chd->bshd", c.astype(dtype), compute_cast(wkv_b, dtype),
                    preferred_element_type=jnp.float32).astype(dtype)
    k_nope, v = kv[..., :n_nope], kv[..., n_nope:]
    k_rope = jnp.broadcast_to(k_pe.astype(dtype), k_nope.shape[:-1] + (k_pe.shape[-1],))
    return jnp.concatenate([k_nope, k_rope], axis=-1), v


def _latent_attention(q, c, k_pe, wkv_b, q_seg, kv_seg, q_idx, kv_idx, scale, kv_block, n_nope,
                      dtype):
    """Attention of q [B,T,H,N+R] over the latent keys c [B,S,C] / k_pe [B,S,1,R]: the blocked
    FlashAttention over the latent when S > kv_block, else plain attention over expanded K/V
    (`attend_cpu` where `use_cpu_matmul` says so, else `attend`)."""
    make_kv = functools.partial(mla_kv, n_nope, dtype)
    if c.shape[1] > kv_block:
        return flash_attention(q, (c, k_pe), wkv_b, q_seg, kv_seg, q_idx, kv_idx, make_kv, scale,
                               kv_block)
    k, v = make_kv(wkv_b, c, k_pe)
    mask = attention_mask(q_seg, kv_seg, q_idx, kv_idx)
    if use_cpu_matmul(dtype):      # float32, CPU, one device without a mesh
        return attend_cpu(q, k, v, mask, scale)
    return attend(q, k, v, mask, scale)


def allgather_latent_attention(q, c, k_pe, wkv_b, segment_ids, token_index, scale: float,
                               kv_block: int, n_nope: int, dtype, pc):
    """Context-parallel MLA attention by all-gathering only the latent (C + R values per token).

    Inside `jax.shard_map` every context shard all-gathers c [B,S,C], k_pe [B,S,1,R], segment
    ids and token indices of the whole sequence, then attends with its own queries and heads
    (`_latent_attention`). The backward's latent gradient leaves as one reduce-scatter (the
    all-gather's transpose), and the shared wkv_b's as one psum: nothing per key block crosses
    devices. q [B,T,H,N+R], c [B,T,C], k_pe [B,T,1,R], wkv_b [C,H,N+Dv] (global arrays, sequence
    split over the context axes) -> [B,T,H,Dv].
    """
    seq = pc.axes_of("seq")
    seq_spec = seq if len(seq) > 1 else seq[0]
    batch, heads = pc.axes_of("batch") or None, pc.axes_of("act_heads") or None

    def local(q, c, k_pe, w, seg, idx):
        gather = lambda x: jax.lax.all_gather(x, seq, axis=1, tiled=True)  # noqa: E731
        return _latent_attention(q, gather(c), gather(k_pe), w, seg, gather(seg), idx,
                                 gather(idx), scale, kv_block, n_nope, dtype)

    tok = P(batch, seq_spec)
    fn = jax.shard_map(local, in_specs=(P(batch, seq_spec, heads, None), P(batch, seq_spec, None),
                                        P(batch, seq_spec, None, None), P(None, heads, None), tok,
                                        tok),
                       out_specs=P(batch, seq_spec, heads, None))
    return fn(q, c, k_pe, wkv_b, segment_ids, token_index)


class MLA(nnx.Module):
    def __init__(self, cfg: ModelConfig, pinit: ParamInit, rngs: nnx.Rngs,
                 stack: tuple[int, ...] = ()):
        d, h = cfg.hidden_size, cfg.num_heads
        if cfg.q_lora_rank > 0:
            self.wq_a = make_param(rngs, (d, cfg.q_lora_rank), ("embed", "q_lora"), pinit, stack)
            self.q_norm = RMSNorm(cfg.q_lora_rank, cfg, pinit, stack, eps=LATENT_NORM_EPS)
            self.wq_b = make_param(rngs, (cfg.q_lora_rank, h, cfg.qk_head_dim),
                                   ("q_lora", "heads", "head_dim"), pinit, stack)
        else:
            self.wq = make_param(rngs, (d, h, cfg.qk_head_dim), ("embed", "heads", "head_dim"),
                                 pinit, stack)
        self.wkv_a = make_param(rngs, (d, cfg.kv_lora_rank + cfg.qk_rope_head_dim),
                                ("embed", "kv_lora"), pinit, stack)
        self.kv_norm = RMSNorm(cfg.kv_lora_rank, cfg, pinit, stack, eps=LATENT_NORM_EPS)
        self.wkv_b = make_param(rngs, (cfg.kv_lora_rank, h, cfg.qk_nope_head_dim + cfg.v_head_dim),
                                ("kv_lora", "heads", "head_dim"), pinit, stack)
        self.wo = make_param(rngs, (h, cfg.v_head_dim, d), ("heads", "head_dim", "embed"), pinit,
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
        q = shard(save_as(jnp.concatenate([q_nope, q_pe], axis=-1), "query_proj"),
                  ("batch", "seq", "act_heads", None))
        c, k_pe = self.project_latent(x, ctx)
        c, k_pe = save_as(c, "kv_proj"), save_as(k_pe, "kv_proj")
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
        elif pc is not None and pc.context_parallel > 1:
            out = allgather_latent_attention(q, c, k_pe, self.wkv_b[...], segment_ids, token_index,
                                             scale, ctx.execution.attention_kv_block,
                                             cfg.qk_nope_head_dim, ctx.dtype, pc)
        else:
            out = _latent_attention(q, c, k_pe, self.wkv_b[...], segment_ids, segment_ids,
                                    token_index, token_index, scale,
                                    ctx.execution.attention_kv_block,
                                    cfg.qk_nope_head_dim, ctx.dtype)
        out = shard(save_as(out, "context"), ("batch", "seq", "act_heads", None))
        return save_as(linear(out, self.wo[...], ctx, "bthv,hvd->btd"), "out_proj")


def softmax_scale(cfg: ModelConfig) -> float:
    return rope_lib.softmax_scale_multiplier(cfg.rope) / math.sqrt(cfg.qk_head_dim)
