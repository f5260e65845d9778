"""Asynchronous RL: the main job.

  rl_async   trainer, inference (engine service), rollout workers and evaluator as services that
             talk only through the rollout stream and the weight store; staleness bounded by
             admission control (rl.max_staleness = 2); rollout-level fault tolerance and resume
  rl_sync    the same with rl.max_staleness = 0 (synchronous RL: generate a batch, train, repeat)

Defaults run on a laptop CPU in a few minutes: the known-optimum "parity" task family
(`composer_jax.rl.toy_tasks`) with the `tiny` MoE policy. `--set rl.backend=ray` runs the same
services as Ray actors (`--set rl.ray_address=HOST:PORT` joins a cluster). Outputs in WORKDIR:
config.json, metrics.jsonl, tb/, rollouts/ (the rollout log), checkpoints/, plots/, rl_summary.json.
Rerunning the same command resumes from the newest checkpoint.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib

from composer_jax import registry
from composer_jax.config import Config, RLConfig, RLTasks, Schedule, TrainConfig, to_dict
from composer_jax.errors import ConfigError


def _config(max_staleness: int) -> Config:
    from composer_jax.rl.toy_tasks import toy_model_config
    # the recipe of benchmarks/rl_learning_curve.py (issue 15): Adam at a constant 3e-3, Dr.GRPO
    # with loss_normalizer 64 (about one step's tokens), 4 tasks x 8 samples per step, 6 new
    # tokens per reply. Default: the unconditional parity variant (reply with even characters),
    # which a fresh tiny policy learns in ~60 versions; `--set rl.parity_kinds=even,odd --set
    # rl.steps=300 --set train.steps=300` is the conditional one (slower and less reliable: README)
    rl = RLConfig(group_size=8, batch_groups=4, max_staleness=max_staleness, steps=150,
                  num_rollout_workers=32, checkpoint_every=25, eval_every=50,
                  num_train_tasks=64, num_eval_tasks=16, max_new_tokens=6, seq_len=64,
                  loss_normalizer=64.0, full_snapshot_every=10, parity_kinds=("even",))
    train = TrainConfig(steps=150, lr=3e-3, warmup_steps=0, schedule=Schedule.CONSTANT,
                        weight_decay=0.0, grad_clip=1.0, log_every=1)
    return dataclasses.replace(Config(), model=toy_model_config(), rl=rl, train=train)


def program_spec(cfg: Config):
    """The RL program of `rl.tasks` as a ProgramSpec every process can rebuild."""
    from composer_jax.rl.program import ProgramSpec
    if cfg.rl.tasks == RLTasks.PARITY:
        return ProgramSpec("composer_jax.rl.parity_program:make", {"config": to_dict(cfg)})
    raise ConfigError(f"rl.tasks={cfg.rl.tasks.value} is not wired into rl_async yet; use "
                      f"rl.tasks=parity")


def make_store(cfg: Config):
    """The weight store the trainer publishes to (in-process transport; the inference side reads
    it in this process, or receives versions through Ray's object store with rl.backend=ray)."""
    from composer_jax.config import RLBackend
    from composer_jax.rl.weights import MemoryTransport, WeightStore, WeightSyncSettings
    settings = WeightSyncSettings.from_rl(cfg.rl)
    if cfg.rl.backend == RLBackend.RAY:
        from composer_jax.rl.backend_ray import init_ray, make_ray_store
        init_ray(cfg.rl.ray_address)
        return make_ray_store(settings)
    return WeightStore(MemoryTransport(), settings, reader_name="inference")


def run(cfg: Config, workdir: pathlib.Path) -> dict:
    from composer_jax.rl.driver import run_rl, settings_from_config
    from composer_jax.rl.plots import write_plots
    if cfg.train.steps < cfg.rl.steps and cfg.train.schedule != Schedule.CONSTANT:
        raise ConfigError(f"train.steps={cfg.train.steps} < rl.steps={cfg.rl.steps}: the learning "
                          f"rate schedule would end before the run; raise train.steps")
    from absl import logging
    logging.set_verbosity(logging.WARNING)      # Orbax logs every save at INFO
    try:
        summary = run_rl(program_spec(cfg), workdir, settings_from_config(cfg), make_store(cfg))
    finally:
        if cfg.rl.backend.value == "ray" and not cfg.rl.ray_address:
            import ray
            ray.shutdown()                      # the local cluster this run started
    write_plots(workdir, summary)
    print(json.dumps({k: summary[k] for k in ("version", "rollouts_finished", "rollouts_trained",
                                              "error_rollouts", "worker_restarts", "elapsed_s",
                                              "rollouts_per_sec", "trainer_idle_frac", "eval")}))
    return summary


registry.register("rl_async", "asynchronous RL (streamed rollouts, in-flight weight updates, "
                  "staleness <= rl.max_staleness=2, fault-tolerant; local or Ray backend)",
                  lambda: _config(2), run)
registry.register("rl_sync", "the rl_async job with rl.max_staleness=0 (synchronous RL baseline)",
                  lambda: _config(0), run)
