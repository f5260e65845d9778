"""The MoE FFN for the few tokens of a decode step.

The model's dispatch (`composer_jax.model.moe`) is built for training-sized token counts: on CPU it
pads every expert's assignments to a 64-row block, so one decode token (K assignments) still
multiplies E x 64 rows, and one step of a 4-layer model spent most of its time there. With N
tokens (N*K assignments) a decode step picks the cheapest exact form by shape, at trace time:

  * gather (N*K <= E): each assignment multiplies its own expert's weights (gathered rows),
    N*K matrix-vector products, so it reads N*K expert slabs;
  * blocked (N*K <= DECODE_BLOCK_MAX_ASSIGNMENTS): the model's blocked layout
    (`model.moe._dispatch_blocked`) with `DECODE_EXPERT_BLOCK`-row blocks instead of the training
    block of 64. It reads about ceil(N*K/16) + E expert slabs whatever N is, so gather wins while
    N*K is at most about E (`benchmarks/results/decode_moe_bench.txt`: gather takes 0.50x the
    blocked time at N*K = E and 1.96x at 2E for `small`; 0.24-0.27x for `cpt_debug` at the 6-8
    assignments of a depth-2 speculative verify at batch 1, which the rule N*K <= E/2 sent to
    blocked). At batch 32 of the `small` config (128 assignments over 32 experts) it pads to
    640 rows, where every-expert-on-every-token takes 1,024 and the 64-row layout 2,176. There, on
    2 cores, a decode step took 19 ms, against 34 ms dense, 23 ms with 64-row blocks and 51 ms
    gathered;
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
from composer_jax.model.moe import MoE, _dispatch_blocked, route_local
from composer_jax.parallel.sharding import current

# Rows per block of the decode-sized blocked layout, and the most assignments (N*K) it is used
# for; above that (prefill chunks) the model's own dispatch with its 64-row blocks.
DECODE_EXPERT_BLOCK = 16
DECODE_BLOCK_MAX_ASSIGNMENTS = 4096


def dispatch_path(n: int, k: int, e: int, fmt: str = "bf16", expert_parallel: bool = False) -> str:
    """"gather", "blocked" or "model" for N tokens, top-K of E experts."""
    if fmt != "bf16" or expert_parallel:
        return "model"
    if n * k <= e:
        return "gather"
    return "blocked" if n * k <= DECODE_BLOCK_MAX_ASSIGNMENTS else "model"


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


def experts_blocked(x, idx, weights, w_gate, w_up, w_down, dt):
    """Same contract as `experts_gather`; the model's blocked layout with decode-sized blocks."""
    return _dispatch_blocked(x, idx, weights, w_gate, w_up, w_down, dt,
                             block=DECODE_EXPERT_BLOCK).astype(jnp.float32)


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
    fn = experts_gather if path == "gather" else experts_blocked
    y = fn(x.reshape(b * t, d), idx.reshape(b * t, -1), weights.reshape(b * t, -1),
           moe.w_gate[...], moe.w_up[...], moe.w_down[...], ctx.dtype)
    y = y.astype(x.dtype).reshape(b, t, d)
    if moe.shared is not None:
        y = y + moe.shared(x, ctx)
    return y, idx
