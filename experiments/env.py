"""Environment experiments.

  env_generate       build (or resume) the training task pool in WORKDIR/pool (env.pool_dir), from
                     the CPython stdlibs and the packages in env.package_sources
  env_generate_eval  the same from the held-out modules only (evaluation tasks)
  env_check          run the oracle and null agents over the pool; write WORKDIR/env_check.json
                     (with per-kind counts and median lines_changed)

Override with e.g. `--set env.num_tasks=300 --set env.python_versions=3.12,3.13`.
No JAX is imported by these experiments.
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
    from composer_jax.env.tasks.generate import generate_pool
    from composer_jax.runlog import MetricsWriter

    summary = generate_pool(cfg.env, pool_dir(cfg, workdir))
    with MetricsWriter(workdir, tensorboard=False) as m:
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
    from composer_jax.env.check import check_pool
    from composer_jax.env.tasks.pool import TaskPool

    pool = pool_dir(cfg, workdir)
    if len(TaskPool(pool)) == 0:
        print(f"no tasks in {pool}: generating the pool first")
        _generate(cfg, workdir)
    summary = check_pool(cfg.env, pool, workdir)
    print(json.dumps({k: summary[k] for k in ("num_tasks", "kinds", "sources", "oracle_resolved_rate",
                                              "null_resolved_rate", "oracle_tampered",
                                              "null_tampered", "null_parent_refuted_tasks",
                                              "null_parent_refuted_f2p", "median_lines_changed",
                                              "seconds")}))
    return summary


registry.register("env_generate",
                  "generate validated coding tasks from local CPython code and packages",
                  _generate_config, _generate)
registry.register("env_generate_eval", "generate evaluation tasks from the held-out modules only",
                  _generate_eval_config, _generate)
registry.register("env_check", "oracle and null agents over the task pool -> env_check.json",
                  _check_config, _check)
