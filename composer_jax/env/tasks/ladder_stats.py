"""Statistics of the difficulty ladder: what a ladder pool holds, and how many tasks are possible.

`pool_stats(pool)`: verified tasks per level and split, per (level, split, module), per CPython
version, the held-out modules, and a check that no module has tasks on both sides.
`possible_sites(cfg, spec)`: level-1/level-2 sites (unverified candidates, level-2 ones not even
syntax-checked: `ladder_sites.raw_sites`) of
every source module per level and split: how many tasks the generator could try.
`format_report(...)`: both as text.
"""
from __future__ import annotations

import collections
import pathlib
import random

from composer_jax.env.config import EnvConfig
from composer_jax.env.tasks import ladder_sites
from composer_jax.env.tasks.ladder_generate import LadderSpec, all_sources, task_level
from composer_jax.env.tasks.ladder_split import split_of, top_level
from composer_jax.env.tasks.pool import TaskPool


def site_kind(task) -> str:
    """The mutation kind of a ladder task's first mutation (`name_typo`, `keyword_typo`, `binop_swap`,
    ...; "?" when it has none): what `per_level_site` counts and the RL rows' per-kind level labels."""
    return task.mutations[0].split(" ", 1)[0] if task.mutations else "?"


def pool_stats(pool: TaskPool) -> dict:
    """The ladder tasks (levels 1 and 2) of `pool`, counted (module docstring)."""
    tasks = [t for t in pool.tasks() if task_level(t.kind) in (1, 2)]
    sides = collections.defaultdict(set)
    for t in tasks:
        sides[top_level(t.module)].add(t.split)
    per_module = collections.Counter((task_level(t.kind), t.split, t.module) for t in tasks)
    return {
        "num_tasks": len(tasks),
        "per_level_split": {f"level{lv}/{sp}": n for (lv, sp), n in sorted(collections.Counter(
            (task_level(t.kind), t.split) for t in tasks).items())},
        "per_level_version": {f"level{lv}/{v}": n for (lv, v), n in sorted(collections.Counter(
            (task_level(t.kind), t.python_version) for t in tasks).items())},
        "per_level_site": {f"level{lv}/{k}": n for (lv, k), n in sorted(collections.Counter(
            (task_level(t.kind), site_kind(t)) for t in tasks).items())},
        "modules": {f"level{lv}/{sp}": len({m for (l2, s2, m) in per_module if (l2, s2) == (lv, sp)})
                    for lv, sp, _ in sorted(per_module)},
        "per_module": {f"level{lv}/{sp}/{m}": n for (lv, sp, m), n in sorted(per_module.items())},
        "heldout_modules": sorted(m for m, s in sides.items() if "eval" in s),
        "modules_on_both_sides": sorted(m for m, s in sides.items() if len(s) > 1),
    }


def possible_sites(cfg: EnvConfig, spec: LadderSpec) -> dict:
    """{"level1/train": {"modules": n, "sites": n}, ...} over every source module of every
    configured CPython (each module's text parsed once per version)."""
    out = collections.defaultdict(collections.Counter)
    versions = sorted(cfg.python_versions, key=lambda v: tuple(map(int, v.split("."))))
    for version, sources in all_sources(cfg, versions).items():
        for src in sources:
            try:
                text = pathlib.Path(src.module_path).read_text(encoding="utf-8")
                side = split_of(src.module, spec.seed, spec.fraction)
                for level in spec.levels:
                    n = len(ladder_sites.raw_sites(text, level, version, random.Random(0), spec.keywords))
                    out[f"level{level}/{side}"]["sites"] += n
                    out[f"level{level}/{side}"]["modules"] += n > 0
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue  # a module the running interpreter cannot parse (newer syntax)
    return {k: dict(v) for k, v in sorted(out.items())}


def format_report(stats: dict, possible: dict | None = None, top: int = 12) -> str:
    """Readable lines of `pool_stats` (and `possible_sites`)."""
    lines = [f"ladder tasks (verified): {stats['num_tasks']}"]
    for key, n in stats["per_level_split"].items():
        lines.append(f"  {key:14s} {n:6d} tasks from {stats['modules'].get(key, 0)} modules")
    lines.append("per level and site kind: " + ", ".join(f"{k}={v}" for k, v in
                                                         stats["per_level_site"].items()))
    lines.append("per level and CPython: " + ", ".join(f"{k}={v}" for k, v in
                                                     stats["per_level_version"].items()))
    lines.append(f"held-out modules with tasks: {', '.join(stats['heldout_modules']) or '-'}")
    lines.append(f"modules on both sides (must be none): "
                 f"{', '.join(stats['modules_on_both_sides']) or 'none'}")
    busiest = sorted(stats["per_module"].items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    lines.append("most tasks per module: " + ", ".join(f"{k}={v}" for k, v in busiest))
    if possible:
        lines.append("possible (unverified candidate sites, every module of every CPython):")
        for key, c in possible.items():
            lines.append(f"  {key:14s} {c.get('sites', 0):7d} sites in {c.get('modules', 0)} "
                         f"module versions")
    return "\n".join(lines)
