"""The coding difficulty ladder (issue 41).

  env_ladder   build (or resume) the ladder pool in WORKDIR/pool (env.pool_dir): per level of
               rl.task.levels, rl.task.ladder_train tasks from training modules and
               rl.task.ladder_heldout from held-out modules (`composer_jax.env.tasks.ladder_*`),
               every task verified in the sandbox; writes WORKDIR/ladder_stats.json and
               ladder_stats.txt (tasks per level, split, module and CPython; candidate sites
               possible) and prints the report. `--set rl.task.levels=1` builds level 1 only.

Then `--experiment=env_check --set env.pool_dir=WORKDIR/pool` runs the oracle and null agents
over the pool (per-kind = per-level rates: level1, level2), and `--experiment=rl_async --set
rl.task=coding --set rl.task.levels=1 --set env.pool_dir=WORKDIR/pool` trains on it. No JAX is
imported here.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib

from composer_jax import registry
from composer_jax.config import Config
from composer_jax.config.rl import CodingTaskConfig


def _config() -> Config:
    cfg = Config()
    task = CodingTaskConfig(levels=(1, 2))
    return dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, task=task))


def _run(cfg: Config, workdir: pathlib.Path) -> dict:
    from composer_jax.env.tasks.ladder_generate import generate_ladder
    from composer_jax.env.tasks.ladder_stats import format_report, pool_stats, possible_sites
    from composer_jax.env.tasks.pool import TaskPool, atomic_write_text
    from composer_jax.errors import ConfigError
    from composer_jax.rl.tasks.coding import ladder_env, ladder_spec

    if not getattr(cfg.rl.task, "levels", ()):
        raise ConfigError("env_ladder needs rl.task=coding with rl.task.levels (1, 2 or 1,2)")
    workdir = pathlib.Path(workdir)
    pool = pathlib.Path(cfg.env.pool_dir) if cfg.env.pool_dir else workdir / "pool"
    env, spec = ladder_env(cfg), ladder_spec(cfg.rl.task)
    runs = generate_ladder(env, pool, spec)
    stats = pool_stats(TaskPool(pool))
    possible = possible_sites(env, spec)
    report = format_report(stats, possible)
    summary = {"pool": str(pool), "python_versions": list(env.python_versions),
               "spec": dataclasses.asdict(spec), "runs": runs, "stats": stats,
               "possible_sites": possible}
    atomic_write_text(workdir / "ladder_stats.json", json.dumps(summary, indent=1))
    atomic_write_text(workdir / "ladder_stats.txt", report + "\n")
    print(json.dumps(runs, indent=1))
    print(report)
    return summary


registry.register("env_ladder", "build the coding difficulty ladder's pool (levels 1-2, train and "
                  "held-out modules, sandbox-verified) and its statistics", _config, _run)
