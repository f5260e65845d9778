"""Mixture-of-experts FFN: routed SwiGLU experts plus always-on shared experts.

Two dispatch paths with identical results:
  * `dispatch_ragged` (default): dropless. The N*K (token, expert) assignments are sorted by expert,
    the expert FFNs run as grouped matmuls (`jax.lax.ragged_dot`, one group per expert), and outputs
    are un-sorted and summed with the combine weights.
  * `dispatch_dense`: every expert processes every token, outputs masked by the (mostly zero) dense
    combine matrix. O(E) compute; a reference for tests.

Shape glossary: N tokens, D model dim, F expert width, E routed experts, K experts per token,
B batch, T tokens per sequence.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from composer_jax.config import ModelConfig, MoEImpl, Remat
from composer_jax.model import router as router_lib
from composer_jax.quant.grouped import grouped_matmul
from composer_jax.model.layers import (MLP, Ctx, ParamInit, RouterBias, linear, make_param,
                                      save_as, swiglu, swiglu_backward)
from composer_jax.parallel.expert import RowCodec, dispatch_expert_parallel
from composer_jax.parallel.per_token import per_token
from composer_jax.parallel import target
from composer_jax.parallel.sharding import current, compute_cast
from composer_jax.quant import quantized_ragged_dot
from composer_jax.quant.wire import decode_mxfp8_rows, encode_mxfp8_rows


def _grouped(x, w, group_sizes, ctx: Ctx, tag: int = 0, amax_axes: tuple[str, ...] = ()):
    """Per-expert matmul in the layer's number format (ctx.fmt); FP32 accumulation.

    The quantized formats use key ctx.subkey(10 + tag) (tags 1/2/3: gate/up/down) for NVFP4's
    stochastic rounding; amax_axes (inside the expert-parallel shard_map) are the mesh axes the
    operands are split over, so NVFP4 per-tensor scales are those of the whole tensor."""
    dt = ctx.dtype
    if ctx.fmt != "bf16":
        return quantized_ragged_dot(x.astype(dt), w.astype(dt), group_sizes, ctx.fmt,
                                    key=ctx.subkey(10 + tag), amax_axes=amax_axes).astype(dt)
    # jax.lax.ragged_dot on GPU/TPU; a blocked batched matmul on CPU (see quant/grouped.py).
    y = grouped_matmul(x.astype(dt), compute_cast(w, dt), group_sizes,
                       preferred_element_type=ragged_result_dtype(dt))
    return y.astype(dt)


def ragged_result_dtype(dt):
    """The result dtype of the expert FFN's grouped matmuls: the compute dtype `dt` on
    accelerators (the dot accumulates in float32 and rounds once to `dt`, which is what the
    float32 result followed by `.astype(dt)` did), float32 on CPU (unchanged program).

    XLA:TPU charges a ragged dot with a float32 result and a cast 1.6x the bytes of one with a bf16
    result, and under autodiff the float32 result makes the transposes run on float32
    cotangents and write float32 weight gradients before rounding them: 3.9x the bytes for
    the weight gradient (libtpu 0.0.50, [32768, 2048] x [64, 2048, 1024]; issue 44)."""
    return jnp.float32 if target.platform() == "cpu" else dt


def expert_parallel_matmul(ctx: Ctx):
    """The local expert matmul for the expert-parallel path (composer_jax.parallel.expert's
    `grouped`): the same quantized ragged dot, keys and tags as `dispatch_ragged`; None (that
    path's bf16 ragged_dot) when the layer is not quantized."""
    if ctx.fmt == "bf16":
        return None
    return lambda x, w, group_sizes, tag, amax_axes: _grouped(x, w, group_sizes, ctx, tag, amax_axes)


def expert_parallel_codec(ctx: Ctx, d: int) -> RowCodec | None:
    """MXFP8 layers send their token rows [., d] to the experts as MXFP8 bytes (1 + 1/32 bytes per
    value instead of bf16's 2; composer_jax.quant.wire explains why the expert matmul's forward
    and input gradient are unchanged); None (rows in the compute dtype) for other formats."""
    if ctx.fmt != "mxfp8":
        return None
    return RowCodec(encode_mxfp8_rows, lambda b: decode_mxfp8_rows(b, d, ctx.dtype))


# Rows per block of the CPU blocked expert FFN (`_dispatch_blocked`), as in
# `quant.grouped.blocked_grouped_matmul`.
CPU_EXPERT_BLOCK = 64


def _dispatch_blocked(x, idx, weights, w_gate, w_up, w_down, dt, block: int = CPU_EXPERT_BLOCK):
    """`dispatch_ragged` for the unquantized path on CPU, with the whole expert FFN in one padded
    block layout: every expert's assignments start on a multiple of `block` rows, so each block of
    rows belongs to one expert and gate, up and down are three batched matmuls over the blocks
    (what `blocked_grouped_matmul` does per matmul). The tokens are gathered straight into that
    layout and the outputs read straight from it: no [N*K, D] sorted copy, no scatter/gather
    between the three matmuls, no inverse sort. Row for row the same products as the per-matmul
    path."""
    n, k = idx.shape
    e, d, _ = w_gate.shape
    m = n * k
    flat = idx.reshape(-1)                                           # [N*K]
    order = jnp.argsort(flat, stable=True)                           # assignments sorted by expert
    sizes = jnp.bincount(flat, length=e).astype(jnp.int32)           # [E]
    starts = jnp.cumsum(sizes) - sizes
    padded = (sizes + block - 1) // block * block
    padded_starts = jnp.cumsum(padded) - padded
    num_blocks = (m + block - 1) // block + e                        # static upper bound
    fs = flat[order]
    dest_sorted = (jnp.arange(m, dtype=jnp.int32) - starts[fs] + padded_starts[fs]).astype(jnp.int32)
    dest = jnp.zeros((m,), jnp.int32).at[order].set(dest_sorted)    # padded row of assignment
    # padded row -> token (n: an empty row, gathered as zeros)
    src = jnp.full((num_blocks * block,), n, jnp.int32).at[dest].set(
        jnp.arange(m, dtype=jnp.int32) // k)
    # row n of the extended x is the zero row of empty slots (an in-bounds gather: no fill mask)
    xz = jnp.concatenate([x.astype(dt), jnp.zeros((1, d), dt)], axis=0)
    xp = xz.at[src].get(mode="promise_in_bounds")
    xp = xp.reshape(num_blocks, block, d)
    block_group = jnp.clip(jnp.searchsorted(padded_starts + padded,
                                            jnp.arange(num_blocks) * block, side="right"), 0, e - 1)

    def mm(a, w):
        return jnp.einsum("jbk,jkn->jbn", a, w[block_group].astype(dt),
                          preferred_element_type=jnp.float32).astype(dt)
    h = jax.nn.silu(mm(xp, w_gate)) * mm(xp, w_up)
    yp = mm(h, w_down).reshape(num_blocks * block, d)
    y = yp[dest].reshape(n, k, d)
    return jnp.einsum("nkd,nk->nd", y.astype(jnp.float32), weights).astype(x.dtype)


@jax.custom_vjp
def combine(y: jax.Array, weights: jax.Array) -> jax.Array:
    """sum_k weights[n,k] * y[n,k,:] in float32: y [N,K,D] (compute dtype), weights [N,K] f32 ->
    [N,D] f32. The backward keeps y in its own dtype (autodiff keeps the float32 copy of y the
    product reads: twice the bytes of the largest per-layer buffer); same formulas."""
    return jnp.einsum("nkd,nk->nd", y.astype(jnp.float32), weights)


def _combine_fwd(y, weights):
    return combine(y, weights), (y, weights)


def _combine_bwd(res, dout):
    y, weights = res
    dy = jnp.einsum("nd,nk->nkd", dout, weights).astype(y.dtype)
    dw = jnp.einsum("nd,nkd->nk", dout, y.astype(jnp.float32))
    return dy, dw


combine.defvjp(_combine_fwd, _combine_bwd)


def _rd(a, w, group_sizes):
    """Grouped matmul in a's dtype (FP32 accumulation), as `_grouped` for the bf16 format."""
    return grouped_matmul(a, w, group_sizes,
                          preferred_element_type=ragged_result_dtype(a.dtype)).astype(a.dtype)


def _transpose(fn, like, ct):
    """The transpose of the linear map `fn` at an argument shaped like `like`, applied to ct."""
    return jax.linear_transpose(fn, like)(ct)[0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def expert_ffn(x, src, w_gate, w_up, w_down, group_sizes, dt):
    """The routed experts' SwiGLU FFN of `dispatch_ragged` (bf16 format) as one op: x [N, D]
    (any float dtype), src [N*K] (the token of each assignment, sorted by expert), w_gate/w_up
    [E, D, F] and w_down [E, F, D] in the compute dtype dt, group_sizes [E] -> ys [N*K, D] in dt.

    Its backward keeps x, src and the gate/up outputs g, u [N*K, F] (and the weights, which the
    remat-none policy re-gathers): not the dispatched copy xs = x[src] [N*K, D] nor h =
    swiglu(g, u), which autodiff keeps (per layer of the mid-size model, 128 + 64 MiB of 448).
    The backward re-reads xs = x[src] and recomputes h from g and u (a gather and elementwise
    products; no matmul is recomputed), then applies autodiff's own transposes in its order."""
    xs = x[src].astype(dt)
    h = swiglu(_rd(xs, w_gate, group_sizes), _rd(xs, w_up, group_sizes))
    return _rd(h, w_down, group_sizes)


def _expert_ffn_fwd(x, src, w_gate, w_up, w_down, group_sizes, dt):
    xs = x[src].astype(dt)
    g, u = _rd(xs, w_gate, group_sizes), _rd(xs, w_up, group_sizes)
    ys = _rd(swiglu(g, u), w_down, group_sizes)
    return ys, (x, src, group_sizes, g, u, w_gate, w_up, w_down)


def _expert_ffn_bwd(dt, res, dys):
    x, src, gs, g, u, w_gate, w_up, w_down = res
    h = swiglu(g, u)
    dh = _transpose(lambda a: _rd(a, w_down, gs), h, dys)
    d_down = _transpose(lambda w: _rd(h, w, gs), w_down, dys)
    dg, du = swiglu_backward((g, u), dh)
    xs = x[src].astype(dt)
    dxs = (_transpose(lambda a: _rd(a, w_gate, gs), xs, dg)
           + _transpose(lambda a: _rd(a, w_up, gs), xs, du))
    d_gate = _transpose(lambda w: _rd(xs, w, gs), w_gate, dg)
    d_up = _transpose(lambda w: _rd(xs, w, gs), w_up, du)
    dx = jnp.zeros(x.shape, x.dtype).at[src].add(dxs.astype(x.dtype))
    return dx, None, d_gate, d_up, d_down, None


expert_ffn.defvjp(_expert_ffn_fwd, _expert_ffn_bwd)


def dispatch_ragged(x, idx, weights, w_gate, w_up, w_down, ctx: Ctx):
    """x [N, D], idx/weights [N, K], w_gate/w_up [E, D, F], w_down [E, F, D] -> [N, D]."""
    if ctx.fmt == "bf16" and target.platform() == "cpu":
        return _dispatch_blocked(x, idx, weights, w_gate, w_up, w_down, ctx.dtype)
    n, k = idx.shape
    e = w_gate.shape[0]
    flat = idx.reshape(-1)                                           # [N*K]
    order = jnp.argsort(flat, stable=True)                           # assignments sorted by expert
    group_sizes = jnp.bincount(flat, length=e).astype(jnp.int32)     # [E]
    if ctx.fmt == "bf16" and ctx.execution.remat == Remat.NONE:
        dt = ctx.dtype
        ys = expert_ffn(x, order // k, compute_cast(w_gate, dt), compute_cast(w_up, dt),
                        compute_cast(w_down, dt), group_sizes, jnp.dtype(dt))
        y = ys[jnp.argsort(order)].reshape(n, k, -1)
        return combine(y, weights).astype(x.dtype)
    xs = x[order // k]                                               # [N*K, D]
    h = swiglu(save_as(_grouped(xs, w_gate, group_sizes, ctx, 1), "mlpwi_0"),
               save_as(_grouped(xs, w_up, group_sizes, ctx, 2), "mlpwi_1"))
    ys = save_as(_grouped(h, w_down, group_sizes, ctx, 3), "mlpwo")     # [N*K, D]
    inverse = jnp.argsort(order)
    y = ys[inverse].reshape(n, k, -1)
    return combine(y, weights).astype(x.dtype)


def dispatch_dense(x, idx, weights, w_gate, w_up, w_down, ctx: Ctx):
    """Same contract as `dispatch_ragged`; every expert runs on every token (reference)."""
    e = w_gate.shape[0]
    combine = (jax.nn.one_hot(idx, e, dtype=jnp.float32) * weights[..., None]).sum(1)  # [N, E]
    g = linear(x, w_gate, ctx, "nd,edf->enf")
    u = linear(x, w_up, ctx, "nd,edf->enf")
    y = linear(jax.nn.silu(g) * u, w_down, ctx, "enf,efd->end")                      # [E, N, D]
    return jnp.einsum("end,ne->nd", y.astype(jnp.float32), combine).astype(x.dtype)


def route_local(x, segment_ids, w_router, bias, cfg: ModelConfig, replay_idx=None):
    """`router.route_tokens` on each device's own tokens (composer_jax.parallel.per_token):
    x [B,T,D], segment_ids [B,T], w_router [D,E], bias [E], replay_idx [B,T,K] or None ->
    ((idx [B,T,K], weights [B,T,K], scores [B,T,E]), counts [E] summed over all token shards).

    Under a parallel context the [N, E] logits and scores never leave their device (the router
    weight and bias, D x E and E values, are replicated); without one it is `route_tokens`."""
    tokens = (x, segment_ids) if replay_idx is None else (x, segment_ids, replay_idx)

    def fn(tok, shared):
        return router_lib.route_tokens(*tok[:2], *shared, cfg, *tok[2:])
    return per_token(fn, tokens, (w_router, bias))


class MoE(nnx.Module):
    def __init__(self, cfg: ModelConfig, pinit: ParamInit, rngs: nnx.Rngs,
                 stack: tuple[int, ...] = ()):
        d, e, f = cfg.hidden_size, cfg.num_routed_experts, cfg.moe_intermediate_size
        self.router = make_param(rngs, (d, e), ("embed", "router"), pinit, stack)
        self.bias = make_param(None, (e,), ("router",), pinit, stack, init="zeros",
                               kind=RouterBias)
        self.w_gate = make_param(rngs, (e, d, f), ("expert", "embed", "expert_mlp"), pinit, stack)
        self.w_up = make_param(rngs, (e, d, f), ("expert", "embed", "expert_mlp"), pinit, stack)
        self.w_down = make_param(rngs, (e, f, d), ("expert", "expert_mlp", "embed"), pinit, stack)
        if cfg.num_shared_experts > 0:
            self.shared = MLP(cfg, pinit, cfg.num_shared_experts * f, rngs, stack)
        else:
            self.shared = None

    def __call__(self, x, segment_ids, ctx: Ctx, replay_idx=None):
        """x [B,T,D] -> (y [B,T,D], aux) with aux = {counts [E], idx [B,T,K], balance_loss [],
        dropped_frac [] (capacity-factor expert parallelism; else 0)}.

        Under a parallel context whose rules put experts on the `expert` mesh axis, dispatch goes
        through the all-to-all expert-parallel path (composer_jax.parallel.expert): its local
        expert matmuls are `dispatch_ragged`'s quantized ragged dot (same format, keys and tags;
        NVFP4 per-tensor scales reduced over the mesh), MXFP8 layers dispatch tokens as MXFP8
        bytes. Routing (router matmul, scores, biased group-limited top-k, combine weights, loads)
        runs on each device's own tokens (`route_local`); counts are summed over the token shards,
        so they are global loads.

        replay_idx [B,T,K]: router replay (use these experts). Padding tokens (segment 0) are
        routed like any other but not counted in the loads.
        """
        cfg = ctx.cfg
        b, t, d = x.shape
        (idx, weights, scores), counts = route_local(x, segment_ids, self.router[...],
                                                     self.bias[...], cfg, replay_idx)
        pc = current()
        dropped = jnp.zeros((), jnp.float32)
        if pc is not None and pc.expert_parallel:
            y, dropped = dispatch_expert_parallel(
                x, idx, weights, self.w_gate[...], self.w_up[...], self.w_down[...], ctx.dtype, pc,
                ctx.execution.moe_capacity_factor, grouped=expert_parallel_matmul(ctx),
                codec=expert_parallel_codec(ctx, d))
        else:
            ragged = ctx.execution.moe_impl == MoEImpl.RAGGED
            dispatch = dispatch_ragged if ragged else dispatch_dense

            def local(tok, w):
                xl, il, wl = tok
                bl, tl = xl.shape[:2]
                yl = dispatch(xl.reshape(bl * tl, d), il.reshape(bl * tl, -1),
                              wl.reshape(bl * tl, -1), *w, ctx)
                return yl.reshape(bl, tl, d), {}

            experts = (self.w_gate[...], self.w_up[...], self.w_down[...])
            if ragged and ctx.fmt == "bf16":
                # each device sorts and runs its own tokens' assignments (`per_token`): traced
                # on the global [N*K, D] arrays, XLA's partitioner cannot split the sort and
                # the ragged dots along tokens and ran every device's dispatch on all N*K rows
                # (4 GiB buffers per device at the mid-size side-by-side model)
                y, _ = per_token(local, (x, idx, weights), experts)
            else:   # quantized: the NVFP4 per-tensor scales are global amaxes over all tokens
                y, _ = local((x, idx, weights), experts)
        if self.shared is not None:
            y = y + self.shared(x, ctx)
        valid = (segment_ids != 0)
        aux = {
            "counts": counts,
            "idx": idx,
            "balance_loss": (router_lib.sequence_balance_loss(
                scores, idx, cfg.num_routed_experts, cfg.num_experts_per_tok, valid)
                if ctx.balance_loss
                else jnp.zeros((), jnp.float32)),
            "dropped_frac": dropped,
        }
        return y, aux
