"""The MoE FFN for the few tokens of a decode step.

The model's dispatch (`composer_jax.model.moe`) is built for training-sized token counts: on CPU it
pads every expert's assignments to a 64-row block, so one decode token (K assignments) still
multiplies E x 64 rows, and one step of a 4-layer model spent most of its time there. With N
tokens (N*K assignments) a decode step picks the cheapest exact form by shape, at trace time:

  * gather (N*K <= E): each assignment multiplies its own expert's weights (gathered rows),
    N*K matrix-vector products;
  * dense  (E*N rows <= the blocked layout's rows): every expert on every token, weighted by the
    sparse combine matrix (no gather, one batched matmul per weight);
  * otherwise the model's own dispatch (prefill chunks).

Routing is the model's (`route_local`, router replay included) and every path computes the same
sums, so tokens and log-probabilities match the training forward up to float summation order.
Quantized FFNs (low-precision execution) and expert parallelism keep the model's dispatch.

Shape glossary: B batch, T new tokens, N = B*T, D model dim, F expert width, E experts, K top-k.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from composer_jax.model.layers import Ctx
from composer_jax.model.moe import CPU_EXPERT_BLOCK, MoE, route_local
from composer_jax.parallel.sharding import current


def dispatch_path(n: int, k: int, e: int, fmt: str = "bf16", expert_parallel: bool = False) -> str:
    """"gather", "dense" or "model" for N tokens, top-K of E experts."""
    if fmt != "bf16" or expert_parallel:
        return "model"
    if n * k <= e:
        return "gather"
    blocked_rows = (-(-n * k // CPU_EXPERT_BLOCK) + e) * CPU_EXPERT_BLOCK
    return "dense" if e * n <= blocked_rows else "model"


def _mm(spec, a, w, dt):
    return jnp.einsum(spec, a.astype(dt), w.astype(dt), preferred_element_type=jnp.float32)


def experts_gather(x, idx, weights, w_gate, w_up, w_down, dt):
    """x [N,D], idx/weights [N,K], w_gate/w_up [E,D,F], w_down [E,F,D] -> [N,D] (f32 sums)."""
    n, k = idx.shape
    flat = idx.reshape(-1)
    xs = jnp.repeat(x, k, axis=0)                                     # [N*K, D]
    h = (jax.nn.silu(_mm("md,mdf->mf", xs, w_gate[flat], dt).astype(dt))
         * _mm("md,mdf->mf", xs, w_up[flat], dt).astype(dt))
    y = _mm("mf,mfd->md", h, w_down[flat], dt).astype(dt).reshape(n, k, -1)
    return jnp.einsum("nkd,nk->nd", y.astype(jnp.float32), weights)


def experts_dense(x, idx, weights, w_gate, w_up, w_down, dt):
    """Same contract as `experts_gather`; every expert on every token."""
    e = w_gate.shape[0]
    combine = (jax.nn.one_hot(idx, e, dtype=jnp.float32) * weights[..., None]).sum(1)   # [N,E]
    h = (jax.nn.silu(_mm("nd,edf->enf", x, w_gate, dt).astype(dt))
         * _mm("nd,edf->enf", x, w_up, dt).astype(dt))
    y = _mm("enf,efd->end", h, w_down, dt).astype(dt)
    return jnp.einsum("end,ne->nd", y.astype(jnp.float32), combine)


def moe_cached(moe: MoE, x, segment_ids, ctx: Ctx, replay=None):
    """`MoE.__call__` for a decode window: x [B,T,D], segment_ids [B,T], replay [B,T,K] or None
    -> (y [B,T,D], expert indices [B,T,K])."""
    cfg = ctx.cfg
    b, t, d = x.shape
    pc = current()
    path = dispatch_path(b * t, cfg.num_experts_per_tok, cfg.num_routed_experts, ctx.fmt,
                         pc is not None and pc.expert_parallel)
    if path == "model":
        y, aux = moe(x, segment_ids, ctx, replay)
        return y, aux["idx"]
    (idx, weights, _), _ = route_local(x, segment_ids, moe.router[...], moe.bias[...], cfg, replay)
    fn = experts_gather if path == "gather" else experts_dense
    y = fn(x.reshape(b * t, d), idx.reshape(b * t, -1), weights.reshape(b * t, -1),
           moe.w_gate[...], moe.w_up[...], moe.w_down[...], ctx.dtype)
    y = y.astype(x.dtype).reshape(b, t, d)
    if moe.shared is not None:
        y = y + moe.shared(x, ctx)
    return y, idx
