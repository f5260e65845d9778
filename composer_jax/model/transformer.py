"""The DeepSeek-V3 / Kimi-K2 transformer with multi-token prediction (MTP).

Layout: token embedding -> `first_k_dense` dense blocks (one stacked, scanned module) -> MoE blocks
(a second stack) -> final RMSNorm -> untied LM head. MTP module k (1..Dm) takes the previous depth's
hidden state h_{k-1} (h_0 = the main model's last hidden state, before the final norm) and the
embedding of token i+k: h'_k = eh_proj([RMSNorm(Emb(t_{i+k})); RMSNorm(h_{k-1})]) (the order of the
DeepSeek-V3 checkpoints), one transformer block, then its own RMSNorm and the shared LM head.
MTP modules are a stack of depth Dm scanned sequentially.

Use functionally: `graphdef, state = nnx.split(model)`; `nnx.merge(graphdef, state)(tokens)`.

`Transformer(cfg, rngs, execution, init_std)`: `cfg` is the architecture; `execution` (an
`ExecutionConfig`: dtypes, precision, remat, dispatch, attention blocking) is kept on the module as
static structure (part of the graphdef, like `cfg`) and handed to every layer at trace time in the
forward context (`Ctx`), so training, evaluation and the inference engine compute a given model
the same way. To run the same weights another way, build the module with another
`ExecutionConfig` and merge the state into it.

Shape glossary: B batch, T tokens, D model dim, V vocab, K experts per token, E routed experts,
Lm MoE layers, Dm MTP depth.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx, struct

from composer_jax.config import ExecutionConfig, ModelConfig, Remat
from composer_jax.model.attention import MLA
from composer_jax.model.layers import (MLP, Ctx, ParamInit, RMSNorm, cpu_without_mesh, linear,
                                      make_param)
from composer_jax.model.moe import MoE
from composer_jax.parallel.sharding import (compute_value, current, gather_for_compute, lookup_on_shards,
                                            saves_all_but_gathered, shard)


@struct.dataclass
class ModelOutput:
    """logits [B,T,V] f32; mtp_logits [Dm,B,T,V] or None; hidden [B,T,D] (pre-final-norm);
    expert_counts [Lm,E] and mtp_expert_counts [Dm,E] (int32, padding excluded);
    router_indices [Lm,B,T,K] and mtp_router_indices [Dm,B,T,K] (int32) or None;
    balance_loss: summed sequence-wise balance loss of all MoE layers (0 when disabled);
    moe_dropped_frac: mean fraction of dropped (token, expert) assignments over MoE layers
    (capacity-factor expert parallelism only; 0 otherwise);
    normed [B,T,D] and mtp_normed [Dm,B,T,D] or None: the hidden states the LM head reads (after
    the final / MTP norms), for losses that apply the head chunk by chunk (`lm_logits`); with
    `logits=False` the full-vocabulary logits are not computed at all (logits/mtp_logits None)."""
    logits: jax.Array
    mtp_logits: jax.Array | None
    hidden: jax.Array
    expert_counts: jax.Array | None
    mtp_expert_counts: jax.Array | None
    router_indices: jax.Array | None
    mtp_router_indices: jax.Array | None
    balance_loss: jax.Array
    moe_dropped_frac: jax.Array | None = None
    normed: jax.Array | None = None
    mtp_normed: jax.Array | None = None


class Block(nnx.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then + ffn(norm(x)); ffn dense or MoE."""

    def __init__(self, cfg: ModelConfig, pinit: ParamInit, rngs: nnx.Rngs,
                 stack: tuple[int, ...], moe: bool):
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg, pinit, stack)
        self.attn = MLA(cfg, pinit, rngs, stack)
        self.ffn_norm = RMSNorm(cfg.hidden_size, cfg, pinit, stack)
        self.is_moe = moe
        self.ffn = (MoE(cfg, pinit, rngs, stack) if moe
                    else MLP(cfg, pinit, cfg.dense_intermediate_size, rngs, stack))

    def __call__(self, x, positions, segment_ids, ctx: Ctx, replay_idx=None, token_index=None):
        x = x + self.attn(self.attn_norm(x), positions, segment_ids, ctx, token_index)
        h = self.ffn_norm(x)
        if self.is_moe:
            y, aux = self.ffn(h, segment_ids, ctx, replay_idx)
        else:
            y, aux = self.ffn(h, ctx), None
        return shard(x + y, ("batch", "seq", "act_embed")), aux


_PROJ = ("query_proj", "kv_proj", "out_proj")
_FFN = ("mlpwi_0", "mlpwi_1", "mlpwo")
# The named policies (MaxText's remat_policy names): the tagged values each saves
# (`layers.save_as`: query_proj = q after rope, kv_proj = the MLA latent and rope key,
# context = attention output, out_proj = after wo, mlpwi_0/1 = FFN gate/up, mlpwo = FFN down;
# dense and ragged-dispatch expert FFNs alike); everything else is recomputed.
REMAT_SAVED = {
    Remat.MINIMAL: _PROJ + _FFN,
    Remat.MINIMAL_WITH_CONTEXT: _PROJ + _FFN + ("context",),
    Remat.SAVE_DOT_EXCEPT_MLP: _PROJ,
    Remat.SAVE_DOT_EXCEPT_MLPWI: _PROJ + ("mlpwo",),
    Remat.SAVE_QKV_PROJ: ("query_proj", "kv_proj"),
    Remat.SAVE_OUT_PROJ: ("out_proj",),
}


def _remat(fn, policy: Remat, unrolled: bool = True):
    """The scanned layer body `fn` under `policy`; unrolled: whether the scan runs unrolled.

    NONE keeps every activation. On a mesh it still wraps the body in `jax.checkpoint` with a
    policy that saves everything except the layer's parameters gathered for compute and their
    compute-dtype copies (`sharding.saves_all_but_gathered`): no activation and no matmul is
    recomputed, the backward gathers the layer's parameter shards again (FSDP). Without a mesh
    it is the body as it is.

    The other policies recompute under `jax.checkpoint`. In a rolled scan the loop already keeps
    the recomputation apart from the forward, so no optimization barriers are added
    (prevent_cse=False, as MaxText does under scan_layers): the barriers only block fusion,
    and a stack of one layer, whose loop XLA removes, recomputes nothing its forward already
    computed (issue 44). Unrolled (one CPU device, `unroll_layer_scans`) they are kept."""
    if policy == Remat.NONE:
        if current() is None:
            return fn
        return jax.checkpoint(
            fn, prevent_cse=False,
            policy=saves_all_but_gathered)
    cse = bool(unrolled)
    if policy == Remat.FULL:
        return jax.checkpoint(fn, prevent_cse=cse)
    if policy == Remat.DOTS:
        return jax.checkpoint(fn, prevent_cse=cse, policy=jax.checkpoint_policies.dots_saveable)
    if policy == Remat.DOTS_NO_BATCH:
        return jax.checkpoint(fn, prevent_cse=cse,
                              policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
    return jax.checkpoint(fn, prevent_cse=cse, policy=jax.checkpoint_policies.save_only_these_names(
        *REMAT_SAVED[policy]))


def unroll_layer_scans() -> bool:
    """Whether the training forward's layer scans (`scan_blocks`, `MTPLayers`) run fully unrolled:
    where `layers.cpu_without_mesh` (one CPU device, no mesh).

    Differentiating a scan makes its forward stack every per-layer residual the backward reads into
    [L, ...] buffers; XLA:CPU zero-fills those buffers, writes them layer by layer
    (dynamic-update-slice) and the backward reads them back with dynamic slices: on the `small`
    config these copies were ~20% of the train step. Unrolled (`lax.scan(unroll=True)`: no while
    loop), each layer's residuals are plain buffers. Same operations, bitwise-equal results (the
    train step's metrics were checked); compile time grows with the number of layers. On a mesh
    (and so in the planner's memory figures) nothing changes."""
    return cpu_without_mesh()


def drive_layers(blocks: Block, x, ctx: Ctx, layer_fn, xs=None, first_layer: int = 0,
                 remat: Remat = Remat.NONE, unroll: bool = False):
    """The one layer driver of training and inference: scans `layer_fn` over a stack of L blocks.

    layer_fn(block, h, ctx_l, xs_l) -> (h, ys_l): one layer (`block` is the layer slice, its
    weights gathered to their compute layout under a parallel context: FSDP holds one layer's
    weights at a time). xs: pytree of per-layer inputs [L, ...] (router replay, cache slices) or
    None. Returns (h, ys stacked [L, ...]). unroll: run the scan fully unrolled
    (`unroll_layer_scans`).
    Per layer, ctx_l carries the layer's own key (ctx.key split L ways) and its precision: blocks
    whose global index (first_layer + l) is among the last `quant_bf16_last_blocks` of the model
    run BF16 when the model is low-precision (ctx.execution). remat: the rematerialisation
    policy of the body.
    """
    graphdef, state = nnx.split(blocks)
    n = jax.tree.leaves(state)[0].shape[0]
    keys = None if ctx.key is None else jax.random.split(ctx.key, n)
    # Low precision: blocks whose global index is among the last `quant_bf16_last_blocks` stay BF16.
    keep_bf16 = jnp.arange(first_layer, first_layer + n) >= (
        ctx.cfg.num_layers - ctx.execution.quant_bf16_last_blocks)
    mixed = ctx.fmt != "bf16" and ctx.execution.quant_bf16_last_blocks > 0

    def body(h, args):
        layer_state, layer_xs, layer_key, layer_bf16 = args
        layer_state = gather_for_compute(layer_state)
        block = nnx.merge(graphdef, layer_state)

        def run(quantized):
            return layer_fn(block, h, dataclasses.replace(ctx, key=layer_key, quantized=quantized),
                            layer_xs)

        if not mixed:
            return run(ctx.quantized)
        return jax.lax.cond(layer_bf16, lambda: run(False), lambda: run(True))

    return jax.lax.scan(_remat(body, remat, unrolled=bool(unroll)), x,
                        (state, xs, keys, keep_bf16), unroll=bool(unroll))


def scan_blocks(blocks: Block, x, positions, segment_ids, ctx: Ctx, replay=None,
                token_index=None, first_layer: int = 0):
    """The training forward of a stack of L blocks. replay [L,B,T,K] or None -> (x, stacked aux).

    token_index [B,T]: original token indices (context parallelism), default arange. first_layer:
    the stack's first global layer index (for quant_bf16_last_blocks). See `drive_layers`.
    """
    def layer(block, h, c, layer_replay):
        return block(h, positions, segment_ids, c, layer_replay, token_index)

    return drive_layers(blocks, x, ctx, layer, replay, first_layer, ctx.execution.remat,
                        unroll=unroll_layer_scans())


def mtp_ctx(ctx: Ctx) -> Ctx:
    """The MTP blocks follow the last main blocks, so they stay BF16 when
    quant_bf16_last_blocks > 0 (training and inference alike)."""
    if ctx.execution.quant_bf16_last_blocks > 0:
        return dataclasses.replace(ctx, quantized=False)
    return ctx


def mtp_input(m, emb, h_prev, ctx: Ctx):
    """One MTP module's input: eh_proj([RMSNorm(Emb(t_{i+k})); RMSNorm(h_{k-1})]) -> [B,T,D].
    m: the module's slice of `MTPLayers`; emb, h_prev [B,T,D]."""
    x = jnp.concatenate([m.enorm(emb), m.hnorm(h_prev)], axis=-1)
    return linear(x, m.eh_proj[...], ctx)


class MTPLayers(nnx.Module):
    """Dm stacked MTP modules (DeepSeek-V3 style), sharing the model's embedding and LM head."""

    def __init__(self, cfg: ModelConfig, pinit: ParamInit, rngs: nnx.Rngs, moe: bool):
        stack = (cfg.mtp_depth,)
        d = cfg.hidden_size
        self.enorm = RMSNorm(d, cfg, pinit, stack)
        self.hnorm = RMSNorm(d, cfg, pinit, stack)
        self.eh_proj = make_param(rngs, (2 * d, d), ("mtp_concat", "embed"), pinit, stack)
        self.block = Block(cfg, pinit, rngs, stack, moe)
        self.norm = RMSNorm(d, cfg, pinit, stack)

    def __call__(self, h0, future_emb, positions, segment_ids, ctx: Ctx, replay=None,
                 token_index=None):
        """h0 [B,T,D], future_emb [Dm,B,T,D] (Emb(t_{i+k})) -> normed hiddens [Dm,B,T,D], aux.

        Precision: `mtp_ctx`; each module's input: `mtp_input` (shared with inference).
        """
        graphdef, state = nnx.split(self)
        ctx = mtp_ctx(ctx)

        depth = future_emb.shape[0]
        keys = None if ctx.key is None else jax.random.split(jax.random.fold_in(ctx.key, 2), depth)

        def body(h, xs):
            st, emb, rep, key = xs
            c = dataclasses.replace(ctx, key=key)
            m = nnx.merge(graphdef, gather_for_compute(st))
            x = mtp_input(m, emb, h, c)
            x, aux = m.block(x, positions, segment_ids, c, rep, token_index)
            return x, (m.norm(x), aux)

        unroll = unroll_layer_scans()
        _, (normed, aux) = jax.lax.scan(_remat(body, ctx.execution.remat, unrolled=unroll), h0,
                                        (state, future_emb, replay, keys), unroll=unroll)
        return normed, aux


def lm_logits(h: jax.Array, w: jax.Array, dtype) -> jax.Array:
    """Normed hidden [..., D] @ LM head [D, V] in the compute dtype -> float32 logits [..., V]."""
    return jnp.einsum("...d,dv->...v", h.astype(dtype), w.astype(dtype),
                      preferred_element_type=jnp.float32)


def shift_tokens(tokens: jax.Array, k: int) -> jax.Array:
    """tokens [B,T] shifted left by k (t_{i+k}), zero-padded at the end."""
    return jnp.pad(tokens[:, k:], ((0, 0), (0, k)))


class Transformer(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs,
                 execution: ExecutionConfig = ExecutionConfig(), init_std: float = 0.02):
        """cfg: the architecture; execution: how to compute it (kept as `self.execution`, see the
        module docstring; its param_dtype is the dtype the weights are created in); init_std: std
        of the normal init (train.init_std)."""
        execution.check_model(cfg)
        self.cfg = cfg
        self.execution = execution
        pinit = ParamInit(execution.param_dtype, init_std)
        d, v = cfg.hidden_size, cfg.vocab_size
        self.embed = make_param(rngs, (v, d), ("vocab", "embed"), pinit)
        has_moe = cfg.num_moe_layers > 0
        self.dense_layers = (Block(cfg, pinit, rngs, (cfg.first_k_dense,), moe=False)
                             if cfg.first_k_dense > 0 else None)
        self.moe_layers = (Block(cfg, pinit, rngs, (cfg.num_moe_layers,), moe=True) if has_moe
                           else None)
        self.final_norm = RMSNorm(d, cfg, pinit)
        self.lm_head = make_param(rngs, (d, v), ("embed", "vocab"), pinit)
        self.mtp = MTPLayers(cfg, pinit, rngs, moe=has_moe) if cfg.mtp_depth > 0 else None

    def forward_ctx(self, quant_key=None, balance_loss: bool = False) -> Ctx:
        """The forward context of this model (its architecture and `execution`), shared by the
        training forward and the inference engine."""
        return Ctx(self.cfg, self.execution, key=quant_key, balance_loss=balance_loss)

    def embed_tokens(self, tokens, ctx: Ctx):
        """tokens [B,T] -> [B,T,D] in the compute dtype. On a mesh the rows are read from the
        table's storage shards (`lookup_on_shards`: the gradient stays split like the table)."""
        rows = lookup_on_shards(self.embed, tokens)
        if rows is None:
            rows = jnp.take(compute_value(self.embed), tokens, axis=0)
        return rows.astype(ctx.dtype)

    def head(self, h, ctx: Ctx):
        """Normed hidden [..., D] -> float32 logits [..., V]."""
        return lm_logits(h, compute_value(self.lm_head), ctx.dtype)

    def __call__(self, tokens, positions=None, segment_ids=None, router_replay=None,
                 mtp_router_replay=None, with_mtp: bool = True, token_index=None,
                 mtp_tokens=None, quant_key=None, logits: bool = True,
                 balance_loss: bool = False) -> ModelOutput:
        """tokens [B,T] int -> ModelOutput.

        positions [B,T] (default arange; restart per packed document), segment_ids [B,T]
        (default all 1; 0 = padding; attention never crosses segments), router_replay [Lm,B,T,K]
        and mtp_router_replay [Dm,B,T,K]: expert indices to reuse instead of routing afresh.
        token_index [B,T] (default arange) and mtp_tokens [Dm,B,T] (default tokens shifted left by
        k): given by context parallelism, which feeds tokens in load-balanced order
        (composer_jax.parallel.context_parallel.reorder_batch). quant_key: PRNG key for NVFP4's
        stochastic rounding of gradients (execution.precision=nvfp4); None rounds to nearest.
        logits=False: skip the LM head (the train step applies it chunk by chunk to `normed`).
        balance_loss: compute the sequence-wise balance loss (train.seq_aux_loss_coef > 0; else
        `balance_loss` is 0).
        """
        cfg = self.cfg
        ctx = self.forward_ctx(quant_key, balance_loss)
        b, t = tokens.shape
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        if segment_ids is None:
            segment_ids = jnp.ones((b, t), jnp.int32)
        x = shard(self.embed_tokens(tokens, ctx), ("batch", "seq", "act_embed"))
        if self.dense_layers is not None:
            x, _ = scan_blocks(self.dense_layers, x, positions, segment_ids, ctx,
                               token_index=token_index)
        counts = indices = None
        balance = jnp.zeros((), jnp.float32)
        dropped = []
        if self.moe_layers is not None:
            x, aux = scan_blocks(self.moe_layers, x, positions, segment_ids,
                                 dataclasses.replace(ctx, key=None if ctx.key is None else
                                                     jax.random.fold_in(ctx.key, 1)),
                                 router_replay, token_index, first_layer=cfg.first_k_dense)
            counts, indices = aux["counts"], aux["idx"]
            balance = balance + aux["balance_loss"].sum()
            dropped.append(aux["dropped_frac"])
        normed = self.final_norm(x)
        main_logits = (shard(self.head(normed, ctx), ("batch", "seq", "act_vocab")) if logits
                       else None)
        mtp_logits = mtp_normed = mtp_counts = mtp_indices = None
        if self.mtp is not None and with_mtp:
            if mtp_tokens is None:
                mtp_tokens = jnp.stack([shift_tokens(tokens, k)
                                        for k in range(1, cfg.mtp_depth + 1)])
            future = shard(jnp.stack([self.embed_tokens(mtp_tokens[k], ctx)
                                      for k in range(cfg.mtp_depth)]),
                           (None, "batch", "seq", "act_embed"))
            mtp_normed, aux = self.mtp(x, future, positions, segment_ids, ctx, mtp_router_replay,
                                       token_index)
            if logits:
                mtp_logits = shard(self.head(mtp_normed, ctx), (None, "batch", "seq", "act_vocab"))
            if aux is not None:
                mtp_counts, mtp_indices = aux["counts"], aux["idx"]
                balance = balance + aux["balance_loss"].sum()
                dropped.append(aux["dropped_frac"])
        dropped_frac = (jnp.mean(jnp.concatenate(dropped)) if dropped
                        else jnp.zeros((), jnp.float32))
        return ModelOutput(logits=main_logits, mtp_logits=mtp_logits, hidden=x,
                           expert_counts=counts, mtp_expert_counts=mtp_counts,
                           router_indices=indices, mtp_router_indices=mtp_indices,
                           balance_loss=balance, moe_dropped_frac=dropped_frac, normed=normed,
                           mtp_normed=mtp_normed)
