"""The trainer service: takes B complete groups as soon as they are buffered, runs the learner's
pure update step, publishes the new version, records the consumed groups, checkpoints, logs.

Staleness is bounded at consumption: a group holding a rollout whose oldest token is more than
`max_staleness` versions behind the trainer is dropped (stale_policy "drop": recorded as consumed,
counted in `stale_dropped_*`, its admission slot released by the driver) or trained with the
truncated IS correction ("keep": counted in `stale_kept_rollouts`)."""
from __future__ import annotations

import dataclasses
import threading
import time
from typing import Protocol

import numpy as np

from composer_jax.rl.batch_metrics import (behaviour_metrics, error_metrics, group_staleness,
                                           resolved_of, staleness, sync_stats)
from composer_jax.rl.program import Learner
from composer_jax.rl.stream import RolloutLog, RolloutStream



@dataclasses.dataclass
class TrainerProgress:
    """What the trainer thread shares with the driver (read under the GIL, written by one)."""
    version: int = 0
    consumed_groups: set = dataclasses.field(default_factory=set)
    rollouts_trained: int = 0
    tokens_trained: int = 0
    last_reward: float = float("nan")
    wait_s: float = 0.0
    busy_s: float = 0.0
    error: BaseException | None = None
    done: bool = False
    dropped_groups: int = 0          # groups dropped as too stale, over every life of the run


class TrainerHooks(Protocol):
    """What the trainer reports to the run it belongs to (`rl.driver`)."""

    def checkpoint(self, version: int, state, consumed_groups: set) -> None:
        """Saves synchronously (the consumed set is durable before the trainer moves on)."""

    def log_metrics(self, version: int, row: dict) -> None: ...

    def rollouts_per_sec(self) -> float: ...

    def on_version(self, version: int, state) -> None:
        """A new version is published (wake the inference service, copy weights to evaluate)."""


@dataclasses.dataclass(frozen=True)
class TrainerStart:
    """Where the trainer starts: its state, version, the groups already consumed and how many
    of them were dropped as too stale."""
    state: object
    version: int
    consumed_groups: frozenset
    dropped_groups: int = 0


class TrainerService:
    """The training loop of an RL run (module docstring): `batch_groups` groups per step until
    version `total_steps`, a checkpoint every `checkpoint_every` versions and at the last;
    groups older than `max_staleness` (None: no bound) handled by `stale_policy`; `order(version)`:
    the group ids of each step, taken in that order (the reproducible schedule, rl/schedule.py)
    instead of the first complete ones."""

    def __init__(self, learner: Learner, stream: RolloutStream, store, log: RolloutLog,
                 hooks: TrainerHooks, start: TrainerStart, *, batch_groups: int,
                 total_steps: int, checkpoint_every: int, max_staleness: int | None = None,
                 stale_policy: str = "drop", order=None):
        if stale_policy not in ("drop", "keep"):
            raise ValueError(f"stale_policy must be 'drop' or 'keep', got {stale_policy!r}")
        self.max_staleness, self.stale_policy = max_staleness, stale_policy
        self.order = order      # version -> the group ids its step takes (reproducible schedule)
        self.learner, self.stream, self.store, self.log = learner, stream, store, log
        self.hooks = hooks
        self.batch_groups, self.total_steps = batch_groups, total_steps
        self.checkpoint_every = checkpoint_every
        self.state = start.state
        self.progress = TrainerProgress(version=start.version,
                                        consumed_groups=set(start.consumed_groups),
                                        dropped_groups=int(start.dropped_groups))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.staleness_hist: list[int] = []

    def publish_current(self) -> dict:
        """Publishes the current state as its version (start of a run or after a restore)."""
        w = self.learner.weights(self.state)
        return sync_stats(self.store.publish(self.progress.version, w), w)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="trainer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.stream.close()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        try:
            while self.progress.version < self.total_steps and not self._stop.is_set():
                self._one_step()
        except BaseException as e:  # noqa: BLE001  (the driver re-raises it)
            self.progress.error = e
        finally:
            self.progress.done = True

    def _one_step(self) -> None:
        p = self.progress
        t0 = time.monotonic()
        groups, dropped = self._take_groups()
        if groups is None:
            return
        t1 = time.monotonic()
        rollouts = [r for g in groups for r in g.ordered()]
        stale = [s for s in (staleness(r, p.version) for r in rollouts) if s is not None]
        state, metrics = self.learner.step(self.state, [g.ordered() for g in groups])
        new_version = p.version + 1
        w = self.learner.weights(state)
        sync = sync_stats(self.store.publish(new_version, w), w)
        t2 = time.monotonic()
        dropped_rollouts = [r for g in dropped for r in g.ordered()]
        ids = [r.rollout_id for r in rollouts + dropped_rollouts]
        gids = [g.group_id for g in groups + dropped]
        self.log.append_consumed(new_version, gids, ids)
        self.state = state
        p.consumed_groups.update(gids)
        p.version = new_version
        self.hooks.on_version(new_version, state)   # inference loads it now; evaluators copy it
        p.rollouts_trained += len(rollouts)
        tokens = sum(r.num_trainable for r in rollouts)
        p.tokens_trained += tokens
        p.wait_s += t1 - t0
        p.busy_s += t2 - t1
        rewards = np.array([r.total_reward for r in rollouts], np.float64)
        p.last_reward = float(rewards.mean())
        self.staleness_hist.extend(stale)
        row = {
            **{k: v for k, v in metrics.items() if np.ndim(v) == 0},
            "reward_mean": float(rewards.mean()),
            "resolved_rate": float(np.mean([resolved_of(r) for r in rollouts])),
            "error_rate": float(np.mean([r.error is not None for r in rollouts])),
            **self._stale_metrics(stale, dropped, len(dropped_rollouts)),
            **error_metrics(rollouts, getattr(self.learner, "error_penalty", None)),
            "trainer_idle_frac": (t1 - t0) / max(t2 - t0, 1e-9),
            "trainer_idle_frac_total": p.wait_s / max(p.wait_s + p.busy_s, 1e-9),
            "step_time_s": t2 - t0,
            "trained_tokens": float(tokens),
            "trained_tokens_per_sec": tokens / max(t2 - t0, 1e-9),
            "rollouts_per_sec": self.hooks.rollouts_per_sec(),
            **behaviour_metrics(rollouts),
            **sync,
        }
        self.hooks.log_metrics(new_version, row)
        # after the row: a resumed run keeps the rows up to its checkpoint, so none is missing
        if new_version % self.checkpoint_every == 0 or new_version == self.total_steps:
            self.hooks.checkpoint(new_version, state, p.consumed_groups)

    def _take_groups(self):
        """(B groups to train, groups dropped as too stale) or (None, dropped) when stopped.
        With stale_policy "drop", a group whose oldest token is more than max_staleness versions
        behind the trainer is set aside and replaced by the next complete group; the running
        count `progress.dropped_groups` tells the driver to release its admission slot."""
        p = self.progress
        kept, dropped = [], []
        if self.order is not None:          # rl/schedule.py: exactly these groups, in this order
            names = self.order(p.version)
            while (got := self.stream.get_named(names, timeout=0.5)) is None:
                if self._stop.is_set():
                    return None, dropped
            return got, dropped
        while len(kept) < self.batch_groups:
            if self._stop.is_set():
                return None, dropped
            got = self.stream.get_groups(self.batch_groups - len(kept), timeout=0.5)
            for g in got or ():
                if (self.stale_policy == "drop" and self.max_staleness is not None
                        and group_staleness(g.ordered(), p.version) > self.max_staleness):
                    dropped.append(g)
                    p.dropped_groups += 1
                else:
                    kept.append(g)
        return kept, dropped

    def _stale_metrics(self, stale: list[int], dropped: list, dropped_rollouts: int) -> dict:
        """Staleness of the trained rollouts, groups dropped for it, rollouts kept beyond it."""
        bound = self.max_staleness
        return {"staleness_mean": float(np.mean(stale)) if stale else 0.0,
                "staleness_max": float(max(stale)) if stale else 0.0,
                "stale_dropped_groups": float(len(dropped)),
                "stale_dropped_rollouts": float(dropped_rollouts),
                "stale_dropped_groups_total": float(self.progress.dropped_groups),
                "stale_kept_rollouts": float(0 if bound is None else
                                             sum(s > bound for s in stale))}
