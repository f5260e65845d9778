"""env_check: run the oracle and the null agent over every task of a pool.

A sound pool has oracle resolved rate ~1 (the reference fix, applied through the tools, passes the
tests in the sandbox) and null resolved rate 0 (doing nothing never passes). Writes
WORKDIR/env_check.json with num_tasks, kinds, versions, sources, oracle_resolved_rate,
null_resolved_rate, per-kind statistics (`per_kind`: count, median/min/max lines_changed, oracle and
null resolved rates), `median_lines_changed` (kind -> median), how many episodes the grader flagged
as tampering (`oracle_tampered`, `null_tampered`: both must be 0), how much of the null agent's
failure the grader's parent refutes by itself (`null_parent_refuted_tasks`: the fraction of tasks
with a FAIL_TO_PASS test the parent fails on observed values or unreached assertion sites, where a
forged child report cannot resolve the task; `null_parent_refuted_f2p`: the same per test), what
decides a pass without trusting the graded process (`secret_case_tasks`: the share of tasks with
secret cases, `secret_telling_tasks`: with a secret case the unfixed code fails, `held_back_tasks`:
with held-back tests, `no_secret_cases`: task -> why none), the mean reward components of each
agent and the ids of tasks the oracle failed; per-task lines go to metrics.jsonl and transcripts
of failures to WORKDIR/transcripts/.

The episode loop belongs to the agent package (env imports nothing from agent/rl/train/inference/
model): the caller passes it as `play(agent, task, task_dir, cfg) -> Episode`
(`composer_jax.agent.episode.run_episode`).
"""
from __future__ import annotations

import collections
import concurrent.futures as cf
import json
import pathlib
import statistics
import time

from typing import Callable

from tqdm.auto import tqdm

from composer_jax.env import secret
from composer_jax.env.agents import OracleAgent, null_agent
from composer_jax.env.config import EnvConfig
from composer_jax.env.tasks.generate import top_reasons
from composer_jax.env.tasks.pool import TaskPool, atomic_write_text
from composer_jax.errors import ComposerError
from composer_jax.runlog import MetricsWriter


class EmptyPoolError(ComposerError, FileNotFoundError):
    """The pool has no task: generation was never run there, or it ran and made none."""


def empty_pool_message(pool_dir: pathlib.Path) -> str:
    """Why `pool_dir` holds no task: never generated, or generation failed (with the most common
    reasons modules were unusable, read from the baseline caches)."""
    root = pathlib.Path(pool_dir)
    caches = sorted((root / "baselines").glob("*.json"))
    log = root / "candidates.jsonl"
    if not caches and not log.exists():
        return (f"no tasks in pool {root}: env_generate was never run there; run "
                f"`python launch.py --experiment=env_generate` with the same --workdir (or "
                f"env.pool_dir) first")
    modules = {}
    for c in caches:
        modules.update({f"{c.stem}/{m}": b for m, b in json.loads(c.read_text()).items()})
    failed = [b["reason"] for b in modules.values() if not b.get("usable")]
    tried = len(log.read_text().splitlines()) if log.exists() else 0
    lines = [f"the pool {root} is empty because generation failed: env_generate ran there and "
             f"made no task ({len(modules)} modules baselined, {len(modules) - len(failed)} "
             f"usable; {tried} candidates tried)."]
    if failed:
        lines.append("most common reasons modules were unusable:")
        lines += [f"  {n:6d}  {why}" for why, n in top_reasons(failed).items()]
    lines.append("rerun env_generate for the full report, and `python launch.py "
                 "--experiment=env_doctor` to check the sandbox and interpreters")
    return "\n".join(lines)


def _mean(rows: list[dict]) -> dict:
    keys = rows[0].keys() if rows else []
    return {k: sum(r[k] for r in rows) / len(rows) for k in keys}


def check_pool(cfg: EnvConfig, pool_dir: pathlib.Path, workdir: pathlib.Path, *,
               play: Callable, progress: bool = True, limit: int | None = None) -> dict:
    """Runs both agents on every task (or the first `limit`) through `play` (the episode loop,
    module docstring); writes and returns the summary."""
    pool = TaskPool(pool_dir)
    tasks = pool.tasks()[:limit] if limit else pool.tasks()
    if not tasks:
        raise EmptyPoolError(empty_pool_message(pool_dir))
    metrics = MetricsWriter(workdir)
    start = time.monotonic()

    def one(task):
        d = pool.task_dir(task.task_id)
        oracle = play(OracleAgent(task, d), task, d, cfg)
        null = play(null_agent, task, d, cfg)
        return task, oracle, null

    oracle_rewards, null_rewards, failed, no_cases = [], [], [], {}
    resolved = collections.Counter()
    by_kind = collections.defaultdict(collections.Counter)
    with cf.ThreadPoolExecutor(cfg.workers) as ex:
        futs = [ex.submit(one, t) for t in tasks]
        for step, fut in enumerate(tqdm(cf.as_completed(futs), total=len(futs), desc="env_check",
                                        disable=not progress)):
            task, oracle, null = fut.result()
            resolved["oracle"] += oracle.grade.resolved
            resolved["null"] += null.grade.resolved
            resolved["oracle_tampered"] += oracle.grade.tampered
            resolved["null_tampered"] += null.grade.tampered
            refuted = [t for t in task.fail_to_pass
                       if getattr(null.grade, "reasons", {}).get(t, "").startswith(
                           "assertion site")]
            resolved["parent_tasks"] += bool(refuted)
            resolved["parent_f2p"] += len(refuted)
            resolved["f2p"] += len(task.fail_to_pass)
            cases = secret.summary(_secret_cases(pool.task_dir(task.task_id)))
            resolved["secret"] += cases["cases"] > 0
            resolved["secret_telling"] += cases["discriminating"] > 0
            resolved["held_back"] += bool(task.held_back)
            if not cases["cases"]:
                no_cases[task.task_id] = cases["why_none"]
            by_kind[task.kind]["oracle"] += oracle.grade.resolved
            by_kind[task.kind]["null"] += null.grade.resolved
            oracle_rewards.append(oracle.reward.as_dict())
            null_rewards.append(null.reward.as_dict())
            if not oracle.grade.resolved:
                failed.append(task.task_id)
                oracle.save_jsonl(pathlib.Path(workdir) / "transcripts" / f"{task.task_id}.jsonl")
            metrics.write(step, {"task_id": task.task_id, "kind": task.kind,
                                 "oracle_resolved": int(oracle.grade.resolved),
                                 "null_resolved": int(null.grade.resolved),
                                 "oracle_reward": oracle.reward.total,
                                 "null_reward": null.reward.total,
                                 "oracle_calls": oracle.num_calls,
                                 "lines_changed": task.lines_changed,
                                 "oracle_tampered": int(oracle.grade.tampered),
                                 "oracle_seconds": oracle.duration_s})
    n = len(tasks)
    per_kind = {}
    for kind in sorted({t.kind for t in tasks}):
        lines = [t.lines_changed for t in tasks if t.kind == kind]
        per_kind[kind] = {"count": len(lines), "median_lines_changed": statistics.median(lines),
                          "min_lines_changed": min(lines), "max_lines_changed": max(lines),
                          "oracle_resolved_rate": by_kind[kind]["oracle"] / len(lines),
                          "null_resolved_rate": by_kind[kind]["null"] / len(lines)}
    summary = {
        "num_tasks": n,
        "kinds": dict(sorted(collections.Counter(t.kind for t in tasks).items())),
        "versions": dict(sorted(collections.Counter(t.python_version for t in tasks).items())),
        "sources": dict(sorted(collections.Counter(t.source for t in tasks).items())),
        "oracle_resolved_rate": resolved["oracle"] / n,
        "null_resolved_rate": resolved["null"] / n,
        "oracle_tampered": resolved["oracle_tampered"],
        "null_tampered": resolved["null_tampered"],
        "null_parent_refuted_tasks": resolved["parent_tasks"] / n,
        "null_parent_refuted_f2p": resolved["parent_f2p"] / max(resolved["f2p"], 1),
        "secret_case_tasks": resolved["secret"] / n,
        "secret_telling_tasks": resolved["secret_telling"] / n,
        "held_back_tasks": resolved["held_back"] / n,
        "no_secret_cases": dict(sorted(no_cases.items())),
        "median_lines_changed": {k: v["median_lines_changed"] for k, v in per_kind.items()},
        "per_kind": per_kind,
        "oracle_reward": _mean(oracle_rewards),
        "null_reward": _mean(null_rewards),
        "oracle_failed": sorted(failed),
        "seconds": time.monotonic() - start,
    }
    metrics.write(n, {"oracle_resolved_rate": summary["oracle_resolved_rate"],
                      "null_resolved_rate": summary["null_resolved_rate"], "num_tasks": n})
    metrics.close()
    atomic_write_text(pathlib.Path(workdir) / "env_check.json", json.dumps(summary, indent=1))
    return summary


def _secret_cases(task_dir: pathlib.Path) -> dict:
    """The task's stored secret cases (built by its first grading), or none."""
    try:
        return json.loads((pathlib.Path(task_dir) / secret.FILE).read_text())
    except (OSError, ValueError):
        return {"cases": [], "why": "not built (the task was never graded)"}
