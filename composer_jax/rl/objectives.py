"""Pure policy-gradient objectives: Dr.GRPO advantages, the k1 KL estimator, the policy loss.

Shape glossary: N samples (sequences), B batch rows (= N in a step), T tokens per row.
Per-token arrays are aligned with the *targets*: logp[b, t] is the log-probability of the token at
position t+1 given positions <= t (the trainer's `targets`), and mask[b, t] is 1 where that target
token was sampled by the policy (an assistant token), 0 for prompt, tool output and padding.

The objective (Dr.GRPO with a truncated importance correction, k1 KL in the reward):
  R'_n   = R_n - beta * kl_k1_n                                      (KL in the reward)
  A_n    = R'_n - mean_{m in group(n)} R'_m                           (no std normalisation)
  w_bt   = stop_gradient(min(exp(logp_old - behaviour_logp), c))      (truncated IS to the sampler)
  loss   = -(1 / normalizer) * sum_{b,t} mask * w * A_b * logp        (kind="truncated_is")
  loss   = -(1 / normalizer) * sum_{b,t} mask * w * min(r A, clip(r, 1-eps, 1+eps) A)
           with r = exp(logp - logp_old)                              (kind="ppo_clip")
`normalizer` is a constant (rl.loss_normalizer), never the batch's token count, so a long
trajectory's tokens are not down-weighted (Dr.GRPO's fix of GRPO's length bias).

Everything here works on NumPy or JAX arrays of any float dtype and is jit-safe.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

KINDS = ("truncated_is", "ppo_clip")


def group_mean(values: jax.Array, group_ids: jax.Array, weights: jax.Array | None = None):
    """Weighted mean of `values` [N] over the samples that share each sample's group id -> [N].

    weights [N] (default 1): a sample's weight in its group's mean (0 = not counted, e.g. padding
    rows; 1/k for each of an episode's k self-summarization segments, so every episode counts once).
    A group whose weights sum to 0 gets mean 0.
    """
    values = jnp.asarray(values, jnp.float32)
    w = jnp.ones_like(values) if weights is None else jnp.asarray(weights, jnp.float32)
    same = (group_ids[:, None] == group_ids[None, :]).astype(jnp.float32)       # [N, N]
    total = same @ (w * values)
    count = same @ w
    return jnp.where(count > 0, total / jnp.where(count > 0, count, 1.0), 0.0)


def dr_grpo_advantages(rewards: jax.Array, group_ids: jax.Array,
                       weights: jax.Array | None = None) -> jax.Array:
    """Dr.GRPO advantages A = R - mean of R over the samples of the same group (no std
    normalisation). rewards [N] float, group_ids [N] int -> [N] float32. `weights`: see
    `group_mean` (the default counts every sample once)."""
    rewards = jnp.asarray(rewards, jnp.float32)
    return rewards - group_mean(rewards, jnp.asarray(group_ids), weights)


def kl_k1(logp_old: jax.Array, ref_logp: jax.Array, mask: jax.Array) -> jax.Array:
    """Per-sequence k1 estimate of KL(policy || reference): sum_t mask * (logp_old - ref_logp).

    logp_old [B,T]: the trainer's log-probabilities of the sampled tokens before the update;
    ref_logp [B,T]: the frozen reference policy's; mask [B,T] -> [B] float32. It goes into the
    reward (R - beta * k1), not into the loss, so it carries no gradient here.
    """
    d = jnp.asarray(logp_old, jnp.float32) - jnp.asarray(ref_logp, jnp.float32)
    return jax.lax.stop_gradient(jnp.sum(d * mask, axis=-1))


def truncated_is_weight(logp_old: jax.Array, behaviour_logp: jax.Array,
                        is_truncation: float) -> jax.Array:
    """w = stop_gradient(min(exp(logp_old - behaviour_logp), is_truncation)), elementwise."""
    ratio = jnp.exp(jnp.asarray(logp_old, jnp.float32) - jnp.asarray(behaviour_logp, jnp.float32))
    return jax.lax.stop_gradient(jnp.minimum(ratio, is_truncation))


def policy_loss(logp: jax.Array, logp_old: jax.Array, behaviour_logp: jax.Array,
                advantages: jax.Array, mask: jax.Array, *, kind: str = "truncated_is",
                is_truncation: float = 2.0, clip_eps: float = 0.2, normalizer: float = 4096.0):
    """The policy-gradient loss of one batch (see the module docstring) -> (loss, metrics).

    logp [B,T] (differentiable: the current policy's log-probabilities of the sampled tokens),
    logp_old [B,T] (the trainer's before the update; treated as a constant), behaviour_logp [B,T]
    (the sampler's), advantages [B], mask [B,T]. `normalizer` is a constant token count.

    metrics (sums over masked tokens, so microbatches add up; divide by `tokens` for means):
      tokens, is_weight_sum, is_weight_max, is_truncated (count of tokens whose ratio exceeded
      the cap), clipped (ppo_clip: count of tokens whose clipped term was the active one; 0 for
      truncated_is), mismatch_abs_sum (sum |logp_old - behaviour_logp|), mismatch_k3_sum (sum of
      the k3 estimate of KL(sampler || trainer): (r - 1) - log r with r = exp(logp_old - behaviour)).
    """
    if kind not in KINDS:
        raise ValueError(f"policy_loss: unknown kind {kind!r}; choose one of {KINDS}")
    if normalizer <= 0:
        raise ValueError(f"policy_loss: normalizer must be > 0 (a constant, rl.loss_normalizer), "
                         f"got {normalizer}")
    logp = jnp.asarray(logp, jnp.float32)
    logp_old = jax.lax.stop_gradient(jnp.asarray(logp_old, jnp.float32))
    behaviour_logp = jnp.asarray(behaviour_logp, jnp.float32)
    mask = jnp.asarray(mask, jnp.float32)
    adv = jax.lax.stop_gradient(jnp.asarray(advantages, jnp.float32))[:, None]       # [B, 1]
    log_ratio_b = logp_old - behaviour_logp
    raw_w = jnp.exp(log_ratio_b)
    w = truncated_is_weight(logp_old, behaviour_logp, is_truncation)
    if kind == "truncated_is":
        per_token = w * adv * logp
        clipped = jnp.zeros_like(mask)
    else:
        r = jnp.exp(logp - logp_old)
        unclipped = r * adv
        clipped_term = jnp.clip(r, 1.0 - clip_eps, 1.0 + clip_eps) * adv
        per_token = w * jnp.minimum(unclipped, clipped_term)
        clipped = jax.lax.stop_gradient((clipped_term < unclipped).astype(jnp.float32))
    loss = -jnp.sum(mask * per_token) / normalizer
    masked_w = jnp.where(mask > 0, raw_w, 0.0)
    metrics = {
        "tokens": jnp.sum(mask),
        "is_weight_sum": jnp.sum(mask * w),
        "is_weight_max": jnp.max(masked_w),
        "is_truncated": jnp.sum(mask * (raw_w > is_truncation)),
        "clipped": jnp.sum(mask * clipped),
        "mismatch_abs_sum": jnp.sum(mask * jnp.abs(log_ratio_b)),
        "mismatch_k3_sum": jnp.sum(mask * ((raw_w - 1.0) - log_ratio_b)),
    }
    return loss, jax.tree.map(jax.lax.stop_gradient, metrics)


def token_logprobs(logits: jax.Array, targets: jax.Array):
    """(log softmax(logits)[targets], entropy) per position. logits [..., V] float32, targets [...]
    int -> two float32 arrays [...]."""
    logz = jax.nn.logsumexp(logits, axis=-1)
    logp_all = logits - logz[..., None]
    picked = jnp.take_along_axis(logp_all, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
    return picked, entropy
