"""Expert routing as pure functions: scoring, biased (group-limited) top-k, replay, balancing.

DeepSeek-V3 / Kimi K2 routing ("noaux_tc"):
  scores  = sigmoid(x @ W_router)                       (float32)
  choice  = scores + bias                               (bias only *selects*)
  groups  : group score = sum of the top-2 choice values in each of n_group groups; keep the
            topk_group best groups, mask the rest
  idx     = top-K of choice among kept experts
  weights = scores[idx] / sum(scores[idx]) * routed_scaling_factor   (norm_topk_prob)
Aux-loss-free balancing: after a step, bias += rate * sign(mean_load - load), loads counted over the
global batch. DeepSeek-V3's sequence-wise balance loss is available as an option.

Shape glossary: N tokens, E routed experts, K experts per token, G groups, B batch, T tokens/seq.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from composer_jax.config import ModelConfig, ScoringFunc


def expert_scores(logits: jax.Array, scoring: ScoringFunc) -> jax.Array:
    """Router logits [N, E] -> scores [N, E] in float32."""
    logits = logits.astype(jnp.float32)
    if scoring == ScoringFunc.SIGMOID:
        return jax.nn.sigmoid(logits)
    return jax.nn.softmax(logits, axis=-1)


def select_experts(scores: jax.Array, bias: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Top-K expert indices [N, K] (int32) by biased, optionally group-limited, scores."""
    choice = scores + bias.astype(jnp.float32)[None, :]
    if cfg.n_group > 1:
        n, e = choice.shape
        grouped = choice.reshape(n, cfg.n_group, e // cfg.n_group)
        group_score = jax.lax.top_k(grouped, 2)[0].sum(-1)                    # [N, G]
        _, top_groups = jax.lax.top_k(group_score, cfg.topk_group)            # [N, topk_group]
        keep = jnp.zeros((n, cfg.n_group), bool).at[jnp.arange(n)[:, None], top_groups].set(True)
        keep = jnp.repeat(keep, e // cfg.n_group, axis=1)                     # [N, E]
        choice = jnp.where(keep, choice, -jnp.inf)
    _, idx = jax.lax.top_k(choice, cfg.num_experts_per_tok)
    return idx.astype(jnp.int32)


def combine_weights(scores: jax.Array, idx: jax.Array, cfg: ModelConfig) -> jax.Array:
    """Weights [N, K] of the chosen experts: un-biased scores, normalised, times the scaling."""
    w = jnp.take_along_axis(scores, idx, axis=-1)
    if cfg.norm_topk_prob:
        w = w / (jnp.sum(w, axis=-1, keepdims=True) + 1e-20)
    return w * cfg.routed_scaling_factor


def route(logits: jax.Array, bias: jax.Array, cfg: ModelConfig,
          replay_idx: jax.Array | None = None):
    """Routes tokens. logits [N, E] -> (idx [N, K] int32, weights [N, K] f32, scores [N, E] f32).

    With `replay_idx` [N, K] (router replay) those experts are used instead of a fresh selection;
    their weights are still computed from the current scores, so gradients flow as usual.
    """
    scores = expert_scores(logits, cfg.scoring)
    if replay_idx is None:
        idx = select_experts(scores, bias, cfg)
    else:
        idx = replay_idx.astype(jnp.int32)
    return idx, combine_weights(scores, idx, cfg), scores


def route_tokens(x: jax.Array, segment_ids: jax.Array, w_router: jax.Array, bias: jax.Array,
                 cfg: ModelConfig, replay_idx: jax.Array | None = None):
    """The whole per-token routing of x [B, T, D] with router weight w_router [D, E]:
    -> ((idx [B, T, K] int32, weights [B, T, K] f32, scores [B, T, E] f32), counts [E] int32).

    Logits in float32, then `route`; counts are this call's expert loads (`expert_counts`,
    padding tokens, segment 0, not counted). Every output but the counts is per token, so it can
    run on each device's own tokens (composer_jax.parallel.per_token) with counts summed after.
    """
    b, t, d = x.shape
    xf = x.reshape(b * t, d)
    logits = jnp.einsum("nd,de->ne", xf.astype(jnp.float32), w_router.astype(jnp.float32))
    replay = None if replay_idx is None else replay_idx.reshape(b * t, -1)
    idx, weights, scores = route(logits, bias, cfg, replay)
    counts = expert_counts(idx, cfg.num_routed_experts, (segment_ids != 0).reshape(-1))
    per_tok = (idx.reshape(b, t, -1), weights.reshape(b, t, -1), scores.reshape(b, t, -1))
    return per_tok, counts


def expert_counts(idx: jax.Array, num_experts: int, valid: jax.Array | None = None) -> jax.Array:
    """Tokens routed to each expert [E] (int32) from idx [N, K]; `valid` [N] masks padding."""
    one_hot = jax.nn.one_hot(idx, num_experts, dtype=jnp.int32).sum(1)        # [N, E]
    if valid is not None:
        one_hot = one_hot * valid.astype(jnp.int32)[:, None]
    return one_hot.sum(0)


def update_bias(bias: jax.Array, counts: jax.Array, rate: float) -> jax.Array:
    """Aux-loss-free balancing step: bias += rate * sign(mean_load - load).

    `counts` [..., E] must be the *global* loads (summed over every data shard); leading dims
    (e.g. stacked layers) broadcast.
    """
    load = counts.astype(jnp.float32)
    mean = jnp.mean(load, axis=-1, keepdims=True)
    return (bias.astype(jnp.float32) + rate * jnp.sign(mean - load)).astype(bias.dtype)


def sequence_balance_loss(scores: jax.Array, idx: jax.Array, num_experts: int, top_k: int,
                          valid: jax.Array | None = None) -> jax.Array:
    """DeepSeek-V3 sequence-wise balance loss (without its alpha), averaged over sequences.

    scores [B, T, E], idx [B, T, K], valid [B, T]. Per sequence: sum_i f_i * P_i with
    f_i = E / (K * T) * #tokens routed to i and P_i = mean_t of scores normalised over experts.
    """
    if valid is None:
        valid = jnp.ones(scores.shape[:2], jnp.float32)
    valid = valid.astype(jnp.float32)
    n_tok = jnp.maximum(valid.sum(-1, keepdims=True), 1.0)                          # [B, 1]
    hits = (jax.nn.one_hot(idx, num_experts).sum(2) * valid[..., None]).sum(1)      # [B, E]
    f = hits * num_experts / (top_k * n_tok)
    normed = scores / (scores.sum(-1, keepdims=True) + 1e-20)
    p = (normed * valid[..., None]).sum(1) / n_tok
    return jnp.mean(jnp.sum(f * p, axis=-1))
