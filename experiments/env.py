"""Environment experiments.

  env_generate       build (or resume) the training task pool in WORKDIR/pool (env.pool_dir), from
                     the CPython stdlibs and the packages in env.package_sources
  env_generate_eval  the same from the held-out modules only (evaluation tasks)
  env_check          run the oracle and null agents over the pool; write WORKDIR/env_check.json
                     (with per-kind counts and median lines_changed)
  env_doctor         what works on this machine: sandbox backend, namespaces, interpreters, and a
                     one-task smoke test (generate, oracle, null); WORKDIR/env_doctor.json

Override with e.g. `--set env.num_tasks=300 --set env.python_versions=3.12,3.13`.
No JAX is imported by these experiments. The episode loop (`composer_jax.agent.episode`) is passed
into the environment code from here: env/ imports nothing from the agent package.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib

from composer_jax import registry
from composer_jax.config import Config
from composer_jax.env.config import EnvConfig, Split


def pool_dir(cfg: Config, workdir: pathlib.Path) -> pathlib.Path:
    """env.pool_dir if set, else WORKDIR/pool."""
    return pathlib.Path(cfg.env.pool_dir) if cfg.env.pool_dir else pathlib.Path(workdir) / "pool"


def _generate_config() -> Config:
    return dataclasses.replace(Config(), env=EnvConfig())


def _generate_eval_config() -> Config:
    return dataclasses.replace(Config(), env=EnvConfig(split=Split.EVAL, num_tasks=40,
                                                       max_tasks_per_module=12))


def _check_config() -> Config:
    return dataclasses.replace(Config(), env=EnvConfig())


def _generate(cfg: Config, workdir: pathlib.Path) -> dict:
    from composer_jax.env.tasks.generate import GenerationError, generate_pool
    from composer_jax.runlog import MetricsWriter

    try:
        summary = generate_pool(cfg.env, pool_dir(cfg, workdir))
    except GenerationError as e:  # keep the summary (reason counts) next to the error
        (pathlib.Path(workdir) / "env_generate.json").write_text(json.dumps(e.summary, indent=1))
        raise
    with MetricsWriter(workdir) as m:
        m.write(summary["num_tasks"], {"num_tasks": summary["num_tasks"],
                                       "generation_seconds": summary["seconds"],
                                       "candidates": summary["stats"].get("candidates", 0),
                                       **{f"kind_{k}": v for k, v in summary["kinds"].items()},
                                       **{f"python_{k}": v for k, v in summary["versions"].items()},
                                       **{f"source_{k}": v for k, v in summary["sources"].items()}})
    (pathlib.Path(workdir) / "env_generate.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: summary[k] for k in ("num_tasks", "kinds", "versions", "sources",
                                              "packages_missing", "seconds")}))
    return summary


def _check(cfg: Config, workdir: pathlib.Path) -> dict:
    from composer_jax.agent.episode import run_episode
    from composer_jax.env.check import EmptyPoolError, check_pool, empty_pool_message
    from composer_jax.env.tasks.pool import TaskPool

    pool = pool_dir(cfg, workdir)
    if len(TaskPool(pool)) == 0:
        if (pool / "baselines").is_dir() or (pool / "candidates.jsonl").exists():
            raise EmptyPoolError(empty_pool_message(pool))  # generation ran and failed
        print(f"no tasks in {pool}: generating the pool first")
        _generate(cfg, workdir)
    summary = check_pool(cfg.env, pool, workdir, play=run_episode)
    print(json.dumps({k: summary[k] for k in ("num_tasks", "kinds", "sources", "oracle_resolved_rate",
                                              "null_resolved_rate", "oracle_tampered",
                                              "null_tampered", "null_parent_refuted_tasks",
                                              "null_parent_refuted_f2p", "secret_case_tasks",
                                              "secret_telling_tasks", "held_back_tasks",
                                              "median_lines_changed", "seconds")}))
    print(f"secret cases on {summary['secret_case_tasks']:.0%} of tasks (the unfixed code fails "
          f"one on {summary['secret_telling_tasks']:.0%}); held-back tests on "
          f"{summary['held_back_tasks']:.0%}")
    return summary


def _doctor(cfg: Config, workdir: pathlib.Path) -> dict:
    from composer_jax.agent.episode import run_episode
    from composer_jax.env.doctor import diagnose
    from composer_jax.env.tasks.pool import atomic_write_text
    from composer_jax.errors import ComposerError

    report = diagnose(cfg.env, workdir, run_episode)
    atomic_write_text(pathlib.Path(workdir) / "env_doctor.json", json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    smoke = report["smoke_test"]
    if not smoke["ok"]:
        raise ComposerError(f"env_doctor: the one-task smoke test failed on backend "
                            f"{report['backend']}: {smoke.get('error') or smoke}")
    note = ("" if report["backend"] == "bwrap" else
            "; NOT isolated: RL on environment rewards needs env.allow_unsandboxed_rewards=true")
    print(f"env_doctor: OK, backend {report['backend']}{note}")
    return report


registry.register("env_generate",
                  "generate validated coding tasks from local CPython code and packages",
                  _generate_config, _generate)
registry.register("env_generate_eval", "generate evaluation tasks from the held-out modules only",
                  _generate_eval_config, _generate)
registry.register("env_check", "oracle and null agents over the task pool -> env_check.json",
                  _check_config, _check)
registry.register("env_doctor", "what the coding environment can do here: sandbox backend, "
                  "namespaces, interpreters, one-task smoke test", _check_config, _doctor)
