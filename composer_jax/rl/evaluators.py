"""Held-out evaluation during an RL run: `EvaluatorService` (greedy episodes of the program's
held-out tasks, run by the rollout workers) and `CheckpointEvaluator` (an external function, e.g.
the eval suite's runner, on copies of the trainer's weights, on its own thread)."""
from __future__ import annotations

import sys
import threading
import time
import traceback
from typing import Callable

import numpy as np

from composer_jax.agent.rollout import Rollout
from composer_jax.rl.batch_metrics import (behaviour_metrics, level_metrics, outcome_metrics,
                                           resolved_of, standard_error)
from composer_jax.rl.jobs import EVAL, Job


class EvaluatorService:
    """Held-out evaluation of policy versions by the program's own held-out tasks (the parity
    program: held-out parity tasks, NOT the eval suite): the driver schedules one greedy episode
    per held-out task whenever the trainer passes a multiple of `eval_every`; `record` collects
    them and logs, once a version's episodes are all in, `heldout_parity_resolved_rate` and
    `heldout_parity_reward_mean` with their standard errors (`_se`; prefix `name`), and the same
    rate under the stable name `eval_resolved_rate` with `eval_source` = 1 (held-out program tasks; the eval suite's
    checkpoint evaluator logs `eval_source` = 2)."""

    SOURCE = 1.0

    def __init__(self, tasks: list[str], eval_every: int, log_metrics: Callable,
                 name: str = "heldout_parity"):
        self.tasks, self.eval_every, self.name = list(tasks), eval_every, name
        self._log_metrics = log_metrics
        self._pending: dict[int, dict[str, Rollout]] = {}
        self.scheduled: set[int] = set()
        self.results: dict[int, dict] = {}

    def due(self, version: int) -> bool:
        return (bool(self.tasks) and self.eval_every > 0 and version % self.eval_every == 0
                and version not in self.scheduled)

    def jobs(self, version: int, seed: int) -> list[Job]:
        self.scheduled.add(version)
        self._pending[version] = {}
        return [Job(f"eval{version:06d}-{i:04d}", 0, t, seed + i, EVAL, version)
                for i, t in enumerate(self.tasks)]

    def record(self, job: Job, rollout: Rollout) -> None:
        got = self._pending.setdefault(job.eval_version, {})
        got[job.group_id] = rollout
        if len(got) == len(self.tasks):
            rs = [got[k] for k in sorted(got)]      # task order, not arrival order: the
                                                    # same sums, bit for bit, in every run
            res, rewards = [resolved_of(r) for r in rs], [r.total_reward for r in rs]
            rate = float(np.mean(res))
            row = {f"{self.name}_resolved_rate": rate,
                   f"{self.name}_resolved_se": standard_error(res),
                   f"{self.name}_reward_mean": float(np.mean(rewards)),
                   f"{self.name}_reward_se": standard_error(rewards),
                   f"{self.name}_error_rate": float(np.mean([r.error is not None for r in rs])),
                   f"{self.name}_num_tasks": float(len(rs)),
                   "eval_resolved_rate": rate, "eval_resolved_se": standard_error(res),
                   "eval_source": self.SOURCE, **_sampled_versions(rs), **level_metrics(rs, "eval_"),
                   **outcome_metrics(rs, "eval_"), **_behaviour(rs)}
            self.results[job.eval_version] = row
            del self._pending[job.eval_version]
            self._log_metrics(job.eval_version, row)

    def busy(self) -> bool:
        return bool(self._pending)


def _behaviour(rollouts: list[Rollout]) -> dict:
    """The held-out episodes' behaviour (`behaviour_metrics`: valid-call rate, turns, tokens) as
    `eval_<name>`; the reward terms' means are left to the training rows."""
    return {f"eval_{k}": v for k, v in behaviour_metrics(rollouts).items()
            if not k.startswith("reward_") and k != "tampered"}


def _sampled_versions(rollouts) -> dict:
    """The oldest and newest policy versions the held-out episodes sampled tokens with
    (`eval_sampled_version_min/max`; none when no episode sampled a token): the driver pins the
    engine so both equal the version the row is logged under."""
    vs = [s.versions[s.trainable] for r in rollouts for s in r.segments]
    vs = np.concatenate(vs) if vs else np.zeros(0, np.int32)
    return ({"eval_sampled_version_min": float(vs.min()), "eval_sampled_version_max": float(vs.max())}
            if vs.size else {})


class CheckpointEvaluator:
    """Scores new policy versions with an external evaluation function (the eval suite's runner:
    `experiments/rl.py` passes `composer_jax.eval.api.eval_resolved_rate`, which the rl layer
    must not import). Every `eval_every`-th version (and the last), the trainer's weights are
    copied into a model (`learner.eval_model(state)`) and `eval_fn(model, version) -> dict` runs
    on the evaluator's own thread, one version at a time, beside training; its numeric results
    are logged at that version with `eval_source` = 2 (the eval suite)."""

    SOURCE = 2.0

    def __init__(self, eval_fn: Callable, eval_every: int, log_metrics: Callable,
                 final_version: int):
        self.eval_fn, self.eval_every, self.final = eval_fn, eval_every, final_version
        self._log_metrics = log_metrics
        self._queue: list[tuple[int, object]] = []
        self._cv = threading.Condition()
        self._running = False
        self._current: int | None = None     # the version being evaluated
        self.scheduled: set[int] = set()
        self.results: dict[int, dict] = {}
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="checkpoint-evaluator",
                                        daemon=True)
        self._thread.start()

    def due(self, version: int) -> bool:
        return version not in self.scheduled and (
            (self.eval_every > 0 and version % self.eval_every == 0) or version == self.final)

    def submit(self, version: int, model) -> None:
        with self._cv:
            self.scheduled.add(version)
            self._queue.append((version, model))
            self._cv.notify_all()

    def busy(self) -> bool:
        with self._cv:
            return bool(self._queue) or self._running

    def pending(self) -> set[int]:
        """Versions queued or being evaluated."""
        with self._cv:
            return {v for v, _ in self._queue} | ({self._current} if self._running else set())

    def wait(self, version: int) -> None:
        """Blocks until `version` is evaluated (or failed); interruptible (Ctrl-C)."""
        with self._cv:
            while version in {v for v, _ in self._queue} or (self._running
                                                              and self._current == version):
                self._cv.wait(0.2)

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue:
                    self._cv.wait()
                version, model = self._queue.pop(0)
                self._running, self._current = True, version
            t0 = time.monotonic()
            try:
                out = self.eval_fn(model, version)
                row = {k: float(v) for k, v in out.items()
                       if isinstance(v, (int, float, np.floating, np.integer))
                       and not isinstance(v, bool)}
                row.update(eval_source=self.SOURCE, eval_time_s=time.monotonic() - t0)
                self.results[version] = {**row, **{k: v for k, v in out.items()
                                                   if isinstance(v, str)}}
                self._log_metrics(version, row)
            except Exception as e:  # noqa: BLE001  (an evaluation failure is reported, not fatal)
                self.error = e
                self.results[version] = {"error": f"{type(e).__name__}: {e}"}
                print(f"warning: evaluation of version {version} failed: {type(e).__name__}: "
                      f"{e}\n{traceback.format_exc(limit=6)}", file=sys.stderr)
            finally:
                del model
                with self._cv:
                    self._running = False
                    self._cv.notify_all()
