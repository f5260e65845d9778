"""The learner: `rl_step` (rl/step.py) on batches of B·G rollouts, for any task family's model."""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from composer_jax.errors import ComposerError
from composer_jax.rl.batch import make_batch, replays_routers
from composer_jax.rl.step import build_rl_step
from composer_jax.rl.weights.engine_sync import publishable


class ModelLearner:
    """Trains the model `make_model()` returns (the family's initial policy) with `rl_step`.

    init_state() / state_template(): the initial TrainState (built on first use);
    step(state, groups) -> (state, float metrics); weights(state): what the weight store
    publishes; eval_model(state): a model holding a copy of the weights (the next step donates
    the state), for the checkpoint evaluator."""

    def __init__(self, cfg, make_model: Callable):
        self.cfg = cfg
        self._make_model = make_model
        self._fns = self._state = None
        self.error_penalty = cfg.rl.error_penalty   # error rollouts with tokens: reward -this

    def _build(self):
        if self._fns is None:
            self._fns, self._state = build_rl_step(self._make_model(), self.cfg)
        return self._fns

    def init_state(self):
        self._build()
        return self._state

    def state_template(self):
        return self.init_state()

    def step(self, state, groups):
        fns = self._build()
        rl = self.cfg.rl
        rollouts = [r for g in groups for r in g]
        if rollouts and all(r.error is not None for r in rollouts):
            raise ComposerError(f"every rollout of this step failed, so there is nothing to train; "
                                f"the first: task {rollouts[0].task_id}: {rollouts[0].error}")
        # one row per segment: a self-summarised episode has several, so the rows are padded to
        # the next multiple of B x G (a few fixed shapes, each compiled once)
        rows = rl.batch_groups * rl.group_size
        segments = sum(len(r.segments) for r in rollouts)
        batch = make_batch(rollouts, seq_len=rl.seq_len,
                           batch_size=rows * max(1, -(-segments // rows)),
                           router_replay=replays_routers(self.cfg), error_reward=-self.error_penalty,
                           behaviour=rl.behaviour_reward)
        state, metrics = fns.rl_step(state, batch)
        return state, {k: float(v) for k, v in jax.device_get(metrics).items()}

    def weights(self, state):
        return publishable(state.params, state.buffers)

    def eval_model(self, state):
        fns = self._build()
        return fns.merge(jax.tree.map(jnp.copy, state.params), jax.tree.map(jnp.copy, state.buffers))
