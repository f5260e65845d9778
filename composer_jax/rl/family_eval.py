"""Held-out evaluation of a task family's policy version: the same function in the run and from the
command line, so the two give the same numbers.

    evaluator = FamilyEvaluator(program, cfg)      # one evaluation engine, reused
    row = evaluator(model, version)                # greedy episodes of every held-out task

The model's weights reach the evaluation engine the way they reach the run's inference engine:
`publishable` (the weight store's inference copy: rl.weight_sync.dtype) through a `WeightStore`,
then `load_from` (so the evaluation samples with exactly the weights the run's policy had at that
version). Episodes are the program's own `run_episode` on its held-out tasks (greedy, or with
rl.eval_greedy=false sampled at rl.temperature with the seed `seed + 7919 * version + i` of task i),
run `rl.job.num_rollout_workers` at a time. The row: `eval_resolved_rate` and `eval_reward_mean` with
their standard errors (`eval_resolved_se`, `eval_reward_se`: std / sqrt(n) over the n held-out
tasks), the same under the program's `eval_name` prefix, and per-level metrics (`eval_easy_*`).

`launch.py --experiment=eval --set eval.policy=WORKDIR[@V]` on an RL run of a task family with a
held-out split (lookup, parity) calls `evaluate_run` (experiments/eval.py).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import pathlib
import threading

import numpy as np
from flax import nnx

from composer_jax.config import Config, from_dict
from composer_jax.errors import ConfigError
from composer_jax.rl.batch_metrics import level_metrics, resolved_of, standard_error
from composer_jax.rl.program import LocalClient, build_program
from composer_jax.rl.task_program import task_program_spec
from composer_jax.rl.weights import MemoryTransport, WeightStore, WeightSyncSettings
from composer_jax.rl.weights.engine_sync import publishable
from composer_jax.train.run_checkpoint import checkpoint_steps, parse_run_source, read_meta
from composer_jax.train.weights import load_weights


def checkpoint_eval_fn(cfg, family):
    """The run's checkpoint evaluator `eval_fn(model, version) -> dict`: the family's own
    (`make_eval_fn`, e.g. the coding family's eval suite), else a `FamilyEvaluator` of its
    held-out tasks when the family asks for one (`heldout_on_checkpoints`, the lookup families);
    None with rl.job.eval_every = 0 or neither (the driver then runs held-out episodes on the
    rollout workers)."""
    if cfg.rl.job.eval_every <= 0:
        return None
    own = family.make_eval_fn()
    if own is not None or not family.heldout_on_checkpoints:
        return own
    return FamilyEvaluator(build_program(task_program_spec(cfg)), cfg)


class FamilyEvaluator:
    """Greedy held-out episodes of `program` with a model's weights (module docstring)."""

    def __init__(self, program, cfg, engine_model=None):
        """engine_model: the model the evaluation engine is built on before the evaluated weights
        are loaded into it (default: the program's initial policy; `evaluate_run` passes the
        checkpoint's own model, so evaluating a run never builds, or on an empty cache trains, the
        family's initial policy such as the lookup SFT)."""
        self.program, self.cfg = program, cfg
        self._engine_model = engine_model
        self._server = None
        self._store = None
        self._lock = threading.Lock()

    def _load(self, model, version: int):
        _, params, buffers = nnx.split(model, nnx.Param, ...)
        weights = publishable(nnx.to_pure_dict(params), nnx.to_pure_dict(buffers))
        # a fresh store per evaluation: versions need not grow (WORKDIR@0 after WORKDIR@40)
        sync = WeightSyncSettings(**dataclasses.asdict(self.cfg.rl.weight_sync))
        self._store = WeightStore(MemoryTransport(), sync, reader_name="eval")
        self._store.publish(version, weights)
        if self._server is None:
            self._server = (self.program.make_policy() if self._engine_model is None
                            else self.program.make_policy(self._engine_model))
            self._server.version = -1
        self._server.load_from(self._store, version)

    def __call__(self, model, version: int) -> dict:
        return summarize(self.rollouts(model, version),
                         getattr(self.program, "eval_name", "heldout"), version)

    def rollouts(self, model, version: int) -> list:
        """The held-out episodes of `model` as version `version` (the rollouts `__call__`
        summarises)."""
        with self._lock:
            self._load(model, version)
            client = LocalClient(self._server)
            tasks = list(self.program.eval_tasks())
            seed = self.cfg.seed + 7919 * version
            workers = max(1, min(self.cfg.rl.job.num_rollout_workers, len(tasks)))
            with concurrent.futures.ThreadPoolExecutor(workers) as ex:
                rollouts = list(ex.map(
                    lambda it: self.program.run_episode(it[1], seed + it[0], client,
                                                        greedy=self.cfg.rl.eval_greedy),
                    enumerate(tasks)))
        return rollouts

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None


def summarize(rollouts, name: str, version: int) -> dict:
    """The evaluation row of held-out rollouts (module docstring)."""
    res = [resolved_of(r) for r in rollouts]
    rewards = [r.total_reward for r in rollouts]
    versions = sorted({v for r in rollouts for v in (r.versions_used() or ())})
    out = {"eval_resolved_rate": float(np.mean(res)), "eval_resolved_se": standard_error(res),
           "eval_reward_mean": float(np.mean(rewards)), "eval_reward_se": standard_error(rewards),
           "eval_num_tasks": float(len(rollouts)),
           "eval_error_rate": float(np.mean([r.error is not None for r in rollouts])),
           "eval_generated_tokens_mean": float(np.mean(
               [r.info.get("generated_tokens", 0) for r in rollouts])),
           "eval_version": float(version),
           **level_metrics(rollouts, "eval_")}
    if versions and versions != [version]:
        raise RuntimeError(f"held-out episodes of version {version} were sampled by versions "
                           f"{versions}")
    out.update({f"{name}_resolved_rate": out["eval_resolved_rate"],
                f"{name}_resolved_se": out["eval_resolved_se"],
                f"{name}_reward_mean": out["eval_reward_mean"],
                f"{name}_reward_se": out["eval_reward_se"]})
    return out


def evaluate_run(source: str) -> dict:
    """Scores `source` ("WORKDIR" = its newest checkpoint, "WORKDIR@V" = version V) on the held-out
    split of the run's own task family, with the run's config; returns the evaluation row plus
    `policy`, `version` and `task_family`."""
    cfg = run_config(source)
    program = build_program(task_program_spec(cfg))
    if not program.eval_tasks():
        raise ConfigError(f"eval.policy={source!r}: the run's task family rl.task="
                          f"{cfg.rl.task.family} has no held-out split of its own; use "
                          f"eval.suite=cjbench")
    run_dir, step = parse_run_source(source)
    run_dir = pathlib.Path(run_dir).resolve()     # Orbax reads checkpoints by absolute path
    weights = load_weights(str(run_dir) if step is None else f"{run_dir}@{step}", cfg)
    version = weights.step if weights.step is not None else -1
    model = weights.model()
    ev = FamilyEvaluator(program, cfg, engine_model=model)
    try:
        row = ev(model, version)
    finally:
        ev.close()
    return {"policy": source, "version": version, "task_family": cfg.rl.task.family, **row}


def run_config(source: str):
    """The Config of the run `source` (WORKDIR or WORKDIR@V) names (its config.json)."""
    run_dir, _ = parse_run_source(source)
    cfg_file = pathlib.Path(run_dir) / "config.json"
    if not cfg_file.is_file():
        raise ConfigError(f"eval.policy={source!r}: {run_dir} has no config.json (not a run dir)")
    return from_dict(Config, json.loads(cfg_file.read_text()))


def has_own_heldout(source: str) -> bool:
    """True when `source` is an RL run of a task family with its own held-out split (not the
    coding family, whose held-out evaluation is the eval suite)."""
    try:
        cfg = run_config(source)
    except Exception:  # noqa: BLE001  (not a run directory: another kind of policy)
        return False
    return cfg.rl.task.family != "coding" and _is_rl_run(source)


def _is_rl_run(source: str) -> bool:
    """Whether the run's checkpoints are RL checkpoints (a pretraining run has a default rl
    section too)."""
    run_dir, _ = parse_run_source(source)
    steps = checkpoint_steps(run_dir)
    return bool(steps) and read_meta(run_dir, steps[-1]).get("kind") == "rl"
