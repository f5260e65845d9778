"""The versioned evaluation suite: tasks chosen from an evaluation task pool, frozen with hashes.

A suite is a directory

  SUITE/manifest.json   {"suite_id", "format", "name", "created_from", "categories",
                         "lines_changed" (per category: n, min, median, max), "median_lines_changed",
                         "tasks": [{"task_id", "category", "kind", "module", "python_version",
                                    "lines_changed", "num_fail_to_pass", "num_pass_to_pass",
                                    "sha256", "files": {"snapshot/REL" | "solution/REL": sha256},
                                    "prompts": {"terse", "detailed"}}]}
  SUITE/tasks/<task_id>/{task.json, snapshot/, solution/}   copies of the pool's task directories

`suite_id` = NAME-vFORMAT-<hash of every task hash and prompt>: two suites with the same id hold
byte-identical tasks and prompts, and every result names the suite id it was scored on.
`load_suite` re-hashes every task and refuses a suite whose files changed.

Tasks come only from the pool's "eval" split (held-out modules, `composer_jax.heldout`). Categories:
debugging (kinds bug, multi_bug), feature (feature, large_feature), refactoring (refactor),
migration (migration). Selection (`select_tasks`) spreads the suite over the categories present and
over modules, prefers larger changes, then swaps small tasks for large ones until the suite's
median changed lines reaches `min_median_lines` (or says why it cannot). With a `verify` check
(`oracle_check`, which `eval.api` passes: the oracle replays the reference fix through the real
tools and grader), tasks that fail it are excluded and listed in the manifest.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import pathlib
import shutil
import statistics
from typing import Callable

from composer_jax.agent.episode import run_episode
from composer_jax.env.agents import OracleAgent
from composer_jax.env.tasks.pool import TaskPool, atomic_write_text
from composer_jax.env.tasks.task import Task, load_task
from composer_jax.eval.prompts import prompts as make_prompts
from composer_jax.heldout import is_heldout_path

SUITE_FORMAT = 1
CATEGORY_OF_KIND = {"bug": "debugging", "multi_bug": "debugging", "feature": "feature",
                    "large_feature": "feature", "refactor": "refactoring",
                    "refactoring": "refactoring", "migration": "migration"}
CATEGORIES = ("debugging", "feature", "refactoring", "migration")
MIN_PER_CATEGORY = 2


class SuiteError(ValueError):
    """A suite cannot be built or loaded (the message says why and what to do)."""


def category(kind: str) -> str:
    if kind not in CATEGORY_OF_KIND:
        raise SuiteError(f"task kind {kind!r} has no evaluation category; known kinds: "
                         f"{sorted(CATEGORY_OF_KIND)}")
    return CATEGORY_OF_KIND[kind]


def sha256_text(text: str | bytes) -> str:
    data = text.encode("utf-8") if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()


def task_files(task_dir: pathlib.Path) -> dict[str, str]:
    """{"snapshot/REL" | "solution/REL": sha256 of the file's bytes} of one task directory."""
    out = {}
    for sub in ("snapshot", "solution"):
        base = task_dir / sub
        for p in sorted(base.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                out[f"{sub}/{p.relative_to(base).as_posix()}"] = sha256_text(p.read_bytes())
    return out


def task_hash(task: Task, files: dict[str, str]) -> str:
    """Hash of a task's record and every file of its directory."""
    record = json.dumps(task.to_json(), sort_keys=True)
    return sha256_text(record + "\n" + json.dumps(files, sort_keys=True))


def lines_stats(values) -> dict:
    values = sorted(values)
    if not values:
        return {"n": 0}
    return {"n": len(values), "min": values[0], "median": float(statistics.median(values)),
            "max": values[-1]}


def _round_robin(tasks: list[Task]) -> list[Task]:
    """Largest first, alternating modules (a module's second task comes after every module's first)."""
    by_module = collections.defaultdict(list)
    for t in sorted(tasks, key=lambda t: (-t.lines_changed, t.task_id)):
        by_module[t.module].append(t)
    order, rank = [], 0
    while any(len(v) > rank for v in by_module.values()):
        layer = [v[rank] for v in by_module.values() if len(v) > rank]
        order += sorted(layer, key=lambda t: (-t.lines_changed, t.task_id))
        rank += 1
    return order


def select_tasks(tasks: list[Task], size: int, min_median_lines: int) -> list[Task]:
    """Chooses `size` tasks (see the module docstring); raises SuiteError when the median changed
    lines cannot reach `min_median_lines` with the tasks available."""
    by_cat = collections.defaultdict(list)
    for t in tasks:
        by_cat[category(t.kind)].append(t)
    cats = [c for c in CATEGORIES if by_cat[c]]
    if not cats:
        raise SuiteError("the pool holds no evaluation tasks")
    ordered = {c: _round_robin(by_cat[c]) for c in cats}
    quota = {c: size // len(cats) for c in cats}
    for c in sorted(cats, key=lambda c: -len(by_cat[c]))[: size - sum(quota.values())]:
        quota[c] += 1
    chosen = {c: ordered[c][:quota[c]] for c in cats}
    spare = size - sum(len(v) for v in chosen.values())   # categories with too few tasks
    for c in sorted(cats, key=lambda c: -len(ordered[c])):
        extra = ordered[c][len(chosen[c]):len(chosen[c]) + spare]
        chosen[c] += extra
        spare -= len(extra)

    def med():
        return statistics.median([t.lines_changed for v in chosen.values() for t in v])

    while med() < min_median_lines:
        taken = {t.task_id for v in chosen.values() for t in v}
        unused = [t for c in cats for t in ordered[c]
                  if t.task_id not in taken and t.lines_changed >= min_median_lines]
        shrinkable = [c for c in cats if len(chosen[c]) > MIN_PER_CATEGORY
                      and min(t.lines_changed for t in chosen[c]) < min_median_lines]
        if not unused or not shrinkable:
            big = sum(t.lines_changed >= min_median_lines for t in tasks)
            raise SuiteError(
                f"cannot reach a median of {min_median_lines} changed lines with {size} tasks: the "
                f"pool has {big} tasks of >= {min_median_lines} lines (need > {size // 2}). "
                f"Generate more large tasks (env.kinds with large_feature/refactor/migration, a "
                f"larger env.num_tasks) or lower eval.suite_size / eval.min_median_lines.")
        best = max(unused, key=lambda t: (t.lines_changed, t.task_id))
        victim_cat = max(shrinkable, key=lambda c: len(chosen[c]))
        victim = min(chosen[victim_cat], key=lambda t: (t.lines_changed, t.task_id))
        chosen[victim_cat].remove(victim)
        chosen[category(best.kind)].append(best)
    return sorted((t for v in chosen.values() for t in v), key=lambda t: (CATEGORIES.index(
        category(t.kind)), t.task_id))


def build_suite(pool_dir: pathlib.Path, suite_dir: pathlib.Path, *, name: str, size: int,
                min_median_lines: int,
                verify: Callable[[Task, pathlib.Path], str | None] | None = None) -> dict:
    """Builds a suite directory from the pool's evaluation tasks; returns the manifest.

    `verify(task, task_dir)`: None when a chosen task is sound, else why not (e.g. the reference
    fix, replayed through the tools, does not resolve it under the grader). Rejected tasks are
    left out, the selection is redone without them, and the manifest lists them under
    "excluded" {task_id: why}, so a broken generator shows instead of lowering every score."""
    pool = TaskPool(pathlib.Path(pool_dir))
    all_tasks = pool.tasks()
    leaked = [t.task_id for t in all_tasks if t.split == "eval" and not all(
        is_heldout_path(r) for r in (*t.edit_files, *t.test_files))]
    if leaked:
        raise SuiteError(f"eval-split tasks touch files outside the held-out modules: {leaked[:5]}")
    tasks = [t for t in all_tasks if t.split == "eval"]
    if len(tasks) < size:
        raise SuiteError(f"{pool_dir} holds {len(tasks)} evaluation tasks, fewer than "
                         f"eval.suite_size={size}; run env_generate_eval with a larger env.num_tasks")
    excluded: dict[str, str] = {}
    sound: set[str] = set()
    while True:
        left = [t for t in tasks if t.task_id not in excluded]
        if len(left) < size:
            raise SuiteError(f"only {len(left)} sound evaluation tasks for eval.suite_size={size}; "
                             f"excluded: {dict(list(excluded.items())[:5])}")
        chosen = select_tasks(left, size, min_median_lines)
        if verify is None:
            break
        for t in chosen:
            if t.task_id not in sound:
                why = verify(t, pool.task_dir(t.task_id))
                if why is None:
                    sound.add(t.task_id)
                else:
                    excluded[t.task_id] = why
        if all(t.task_id in sound for t in chosen):
            break
    suite_dir = pathlib.Path(suite_dir)
    tmp = suite_dir.with_name(suite_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    entries = []
    for t in chosen:
        src = pool.task_dir(t.task_id)
        shutil.copytree(src, tmp / "tasks" / t.task_id,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        files = task_files(tmp / "tasks" / t.task_id)
        cat = category(t.kind)
        entries.append({"task_id": t.task_id, "category": cat, "kind": t.kind, "module": t.module,
                        "python_version": t.python_version, "lines_changed": t.lines_changed,
                        "num_fail_to_pass": len(t.fail_to_pass),
                        "num_pass_to_pass": len(t.pass_to_pass),
                        "sha256": task_hash(t, files), "files": files,
                        "prompts": make_prompts(t, cat)})
    digest = sha256_text(json.dumps([(e["task_id"], e["sha256"], e["prompts"]) for e in entries],
                                    sort_keys=True))[:12]
    per_cat = collections.defaultdict(list)
    for e in entries:
        per_cat[e["category"]].append(e["lines_changed"])
    manifest = {
        "suite_id": f"{name}-v{SUITE_FORMAT}-{digest}", "format": SUITE_FORMAT, "name": name,
        "created_from": str(pool_dir), "num_tasks": len(entries),
        "categories": {c: len(per_cat[c]) for c in CATEGORIES},
        "kinds": dict(sorted(collections.Counter(e["kind"] for e in entries).items())),
        "lines_changed": {c: lines_stats(per_cat[c]) for c in CATEGORIES},
        "median_lines_changed": float(statistics.median(e["lines_changed"] for e in entries)),
        "tasks": entries, "verified": verify is not None, "excluded": excluded,
    }
    atomic_write_text(tmp / "manifest.json", json.dumps(manifest, indent=1))
    if suite_dir.exists():
        shutil.rmtree(suite_dir)
    tmp.rename(suite_dir)
    return manifest


ORACLE_CHECK_MAX_TURNS = 1000


def oracle_check(env_cfg):
    """The suite's soundness check for `build_suite(verify=...)`: the oracle replays the reference
    fix through the real tools in an episode with the environment settings `env_cfg` (its turn,
    token and time limits raised so the replay is never cut: the suite is cached by pool and
    builder only, so what it keeps must not depend on a run's eval limits); a task the grader
    does not then resolve is rejected, the returned text says how it failed."""
    env_cfg = dataclasses.replace(env_cfg, max_turns=ORACLE_CHECK_MAX_TURNS,
                                  max_tokens=max(env_cfg.max_tokens, 1 << 24),
                                  episode_time_s=max(env_cfg.episode_time_s, 1800.0))

    def check(task, task_dir) -> str | None:
        ep = run_episode(OracleAgent(task, task_dir), task, task_dir, env_cfg)
        g = ep.grade
        if g.resolved:
            return None
        return (f"the oracle's replay of the reference fix is not resolved by the grader "
                f"(fail-to-pass {g.f2p_passed}/{g.f2p_total}, pass-to-pass {g.p2p_passed}/"
                f"{g.p2p_total}, stop {ep.stop_reason}, tampered {g.tampered})")
    return check


@dataclasses.dataclass(frozen=True)
class SuiteTask:
    """One task of a loaded suite: the task record, its directory, category and prompts."""
    task: Task
    task_dir: pathlib.Path
    category: str
    prompts: dict
    lines_changed: int


@dataclasses.dataclass(frozen=True)
class Suite:
    suite_id: str
    directory: pathlib.Path
    manifest: dict
    tasks: tuple[SuiteTask, ...]


def load_suite(suite_dir: pathlib.Path, verify: bool = True) -> Suite:
    """Loads a suite; with `verify`, re-hashes every task and raises SuiteError on any change."""
    suite_dir = pathlib.Path(suite_dir)
    path = suite_dir / "manifest.json"
    if not path.is_file():
        raise SuiteError(f"{suite_dir} is not an evaluation suite (no manifest.json); build one with "
                         f"`python launch.py --experiment=eval_build_suite`")
    manifest = json.loads(path.read_text())
    out = []
    for e in manifest["tasks"]:
        d = suite_dir / "tasks" / e["task_id"]
        task = load_task(d)
        if verify:
            got = task_hash(task, task_files(d))
            if got != e["sha256"]:
                raise SuiteError(f"suite {manifest['suite_id']}: task {e['task_id']} changed on disk "
                                 f"(hash {got[:12]} != manifest {e['sha256'][:12]}); rebuild the suite")
        out.append(SuiteTask(task, d, e["category"], e["prompts"], e["lines_changed"]))
    return Suite(manifest["suite_id"], suite_dir, manifest, tuple(out))
