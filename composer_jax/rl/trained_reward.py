"""The reward each rollout of a batch is trained with: its total, or, with the behaviour terms
gated by the group's outcome, its total less the behaviour part in groups where nothing resolved.

The behaviour part of an episode's breakdown (`composer_jax.env.rewards`) is

    behaviour = valid_calls + communication - invalid_calls - length

Why gate it: advantages are group-relative, so in a group where every episode fails, the
behaviour part is the whole advantage. A failing edit call pays the invalid-call penalty and more
turns pay the length term, so there the shorter failure (stop before editing) ranks first, and a
weak policy whose groups mostly fail learns to give up. With `rl.behaviour_reward=resolved_groups`
those groups keep only the integrity terms (tampering, false claim, outside edits: they stay in
every group) and the base, so the behaviour terms rank episodes only among groups where the task
was solved at least once. numpy only.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Sequence

import numpy as np

from composer_jax.agent.rollout import Rollout
from composer_jax.config.rl import BehaviourReward
from composer_jax.rl.batch_metrics import resolved_of

# sign of each behaviour term in the total (`env.rewards.compute_reward`)
BEHAVIOUR_SIGNS = {"valid_calls": 1.0, "communication": 1.0, "invalid_calls": -1.0, "length": -1.0}


def behaviour_part(reward: dict) -> float:
    """valid_calls + communication - invalid_calls - length of a reward breakdown (a term the
    breakdown lacks counts 0)."""
    return float(sum(sign * reward.get(term, 0.0) for term, sign in BEHAVIOUR_SIGNS.items()))


def trained_rewards(rollouts: Sequence[Rollout],
                    behaviour: BehaviourReward | str = BehaviourReward.EVERY_GROUP) -> np.ndarray:
    """The reward [N] float64 each of `rollouts` is trained with (groups by `group_id`).

    every_group: `total_reward`. resolved_groups: the same in a group with a resolved rollout; in
    a group with none, `total_reward - behaviour_part(reward)`. Error rollouts get their total
    here (the batch replaces it with the error penalty)."""
    behaviour = BehaviourReward(behaviour)
    totals = np.array([r.total_reward for r in rollouts], np.float64)
    if behaviour is BehaviourReward.EVERY_GROUP:
        return totals
    solved: dict[str, bool] = defaultdict(bool)
    for r in rollouts:
        solved[r.group_id] |= r.error is None and resolved_of(r) > 0
    for i, r in enumerate(rollouts):
        if not solved[r.group_id] and r.error is None:
            totals[i] -= behaviour_part(r.reward)
    return totals
