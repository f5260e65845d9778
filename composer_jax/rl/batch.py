"""Rollouts -> the padded arrays of one RL training batch (numpy only, no JAX).

Every segment of every rollout is one row (self-summarization: an episode of k segments gives k
rows, each carrying the episode's final reward with weight 1/k, so the episode counts once in its
group's mean and in `reward_mean`). Per-token fields are aligned with the *targets*: row b,
position t predicts tokens[b, t+1], so

    tokens, positions, segment_ids       [B,T] int32   (segment_ids 0 on padding)
    targets                              [B,T] int32   tokens shifted left by one
    loss_mask                            [B,T] float32 1 where the target was sampled (trainable)
    behaviour_logp                       [B,T] float32 the sampler's log-prob of the target
    router_replay                        [Lm,B,T,K] int32 experts chosen at sampling for the token
                                         at t (only when every segment recorded them)
    rewards, resolved, sample_weight     [B] float32  episode reward as trained (`trained_reward`),
                                         resolved flag, 1/k (0 = pad)
    group_ids, episode_ids               [B] int32    task group and episode of the row

`advantages` [B] are computed inside the step (the k1 KL needs the trainer's log-probs), from
rewards, group_ids, episode_ids and sample_weight (`composer_jax.rl.step`).

Shape glossary: B rows, T tokens per row, Lm MoE layers, K experts per token.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from composer_jax.config.rl import BehaviourReward
from composer_jax.rl.rollout import NO_EXPERT, Rollout
from composer_jax.rl.trained_reward import trained_rewards


def resolved_of(rollout: Rollout) -> float:
    """1.0 when the rollout's reward breakdown says the task was resolved (key `resolved` or
    `reward_resolved`), else 0.0."""
    r = rollout.reward
    return float(r.get("resolved", r.get("reward_resolved", 0.0)) > 0)


def replays_routers(cfg) -> bool:
    """Whether RL batches carry and the trainer replays the sampler's expert choices:
    rl.router_replay on a model with MoE layers (an all-dense model has no routing to replay, so
    the setting has nothing to act on there)."""
    return bool(cfg.rl.router_replay) and cfg.model.num_moe_layers > 0


def make_batch(rollouts: Sequence[Rollout], *, seq_len: int, batch_size: int | None = None,
               router_replay: bool = True,
               error_reward: float | None = None,
               behaviour: BehaviourReward | str = BehaviourReward.EVERY_GROUP
               ) -> dict[str, np.ndarray]:
    """The training arrays of `rollouts` (module docstring). Error rollouts (`rollout.error`):
    with `error_reward` set, those with sampled tokens are trained with that reward (a crashed
    episode is penalised, never escapes a negative reward) and those without are left out (nothing
    to train; `batch_metrics.error_metrics` counts both); with None every error rollout is left
    out. seq_len: T (a longer segment is an error: raise the length or summarise earlier);
    batch_size: pad to this many rows (default: exactly the number of segments); router_replay:
    include `router_replay` (needs every segment to carry router indices); behaviour: where the
    reward's behaviour terms count (`trained_reward.trained_rewards`)."""
    rows = _rows(rollouts, error_reward, behaviour)
    b = _check_rows(rows, seq_len, batch_size)
    out = _zeros(b, seq_len)
    replay = router_replay and all(s.router_indices is not None for s, *_ in rows)
    if router_replay and not replay:
        raise ValueError("make_batch: router_replay=True but some segments carry no router "
                         "indices; record them (inference capture_router) or set "
                         "rl.router_replay=false")
    if replay:
        lm, k = rows[0][0].router_indices.shape[1:]
        rr = np.broadcast_to(np.arange(k, dtype=np.int32), (lm, b, seq_len, k)).copy()
    for i, (s, reward, resolved, weight, g, e) in enumerate(rows):
        t = len(s)
        out["tokens"][i, :t] = s.tokens
        out["positions"][i, :t] = np.arange(t)
        out["segment_ids"][i, :t] = 1
        out["targets"][i, :t - 1] = s.tokens[1:]
        out["loss_mask"][i, :t - 1] = s.trainable[1:]
        out["behaviour_logp"][i, :t - 1] = s.logprobs[1:]
        out["rewards"][i], out["resolved"][i], out["sample_weight"][i] = reward, resolved, weight
        out["group_ids"][i], out["episode_ids"][i] = g, e
        if replay:
            idx = np.moveaxis(s.router_indices, 1, 0)                     # [Lm, T, K]
            have = (idx != NO_EXPERT).all(-1, keepdims=True)
            rr[:, i, :t] = np.where(have, idx, rr[:, i, :t])   # no forward ran: any valid experts
    if replay:
        out["router_replay"] = rr
    return out


def _rows(rollouts: Sequence[Rollout], error_reward: float | None = None,
          behaviour: BehaviourReward | str = BehaviourReward.EVERY_GROUP) -> list[tuple]:
    """(segment, reward, resolved, weight, group, episode) of every trainable segment (error
    rollouts: see `make_batch`)."""
    def keep(r: Rollout) -> bool:
        return r.error is None or (error_reward is not None and r.num_trainable > 0)

    rows = []
    groups: dict[str, int] = {}
    kept = [x for x in rollouts if keep(x)]
    rewards = trained_rewards(kept, behaviour)
    for e, r in enumerate(kept):
        segs = [s for s in r.segments if len(s) > 1]
        g = groups.setdefault(r.group_id, len(groups))
        reward, resolved = ((float(rewards[e]), resolved_of(r)) if r.error is None
                            else (float(error_reward), 0.0))
        for s in segs:
            rows.append((s, reward, resolved, 1.0 / len(segs), g, e))
    return rows


def _check_rows(rows: list[tuple], seq_len: int, batch_size: int | None) -> int:
    """The number of rows B, after checking the segments fit [B, seq_len]."""
    if not rows:
        raise ValueError("make_batch: no trainable segments (every rollout failed or is empty)")
    n = len(rows)
    b = n if batch_size is None else batch_size
    if b < n:
        raise ValueError(f"make_batch: {n} segments do not fit batch_size={batch_size}; train on "
                         f"fewer rollouts per step or raise the batch size")
    longest = max(len(s) for s, *_ in rows)
    if longest > seq_len:
        raise ValueError(f"make_batch: a segment of {longest} tokens exceeds seq_len={seq_len}; "
                         f"raise the training length or lower rl.summary_trigger_tokens")
    return b


def _zeros(b: int, seq_len: int) -> dict[str, np.ndarray]:
    return {
        "tokens": np.zeros((b, seq_len), np.int32),
        "positions": np.zeros((b, seq_len), np.int32),
        "segment_ids": np.zeros((b, seq_len), np.int32),
        "targets": np.zeros((b, seq_len), np.int32),
        "loss_mask": np.zeros((b, seq_len), np.float32),
        "behaviour_logp": np.zeros((b, seq_len), np.float32),
        "rewards": np.zeros((b,), np.float32),
        "resolved": np.zeros((b,), np.float32),
        "sample_weight": np.zeros((b,), np.float32),
        "group_ids": -1 - np.arange(b, dtype=np.int32),      # padding rows: groups of their own
        "episode_ids": -1 - np.arange(b, dtype=np.int32),
    }
