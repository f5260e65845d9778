"""Does the grader stand behind a task? Its reference fix, graded as an agent's edit would be.

The generator's own checks (`validate.check_candidate`) run the tests in a plain sandboxed
process. The grader runs them differently: in the graded test process (`graded_unittest.py`, with
the installed copies of edit files it imports itself kept at the snapshot's), against the
assertion sites of a reference run, and against secret cases computed by another process. A task
whose reference fix the grader does not resolve fails every honest fix, so it is no task:
`reference_problem` writes the reference through the agent's own tool into a fresh workspace and
grades it `GRADINGS` times (a verdict that depends on the run, a flaky test's, fails one of them
more often than a single grading would); the generator drops a task it returns a reason for, and
`python -m composer_jax.env.tasks.reference_check POOL [--remove]` checks an existing pool.

  python -m composer_jax.env.tasks.reference_check runs/ladder1h/pool            report
  python -m composer_jax.env.tasks.reference_check runs/ladder1h/pool --remove   and drop them
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import pathlib
import sys

from tqdm.auto import tqdm

from composer_jax.env.config import EnvConfig
from composer_jax.env.grading import grade_workspace
from composer_jax.env.tasks.pool import TaskPool
from composer_jax.env.tasks.task import Task
from composer_jax.env.workspace import open_workspace

GRADINGS = 2


def reference_problem(task: Task, task_dir, cfg: EnvConfig, gradings: int = GRADINGS) -> str | None:
    """Why the grader does not resolve `task`'s reference fix (the first failing grading's
    verdict), or None when it resolves it `gradings` times in a row."""
    task_dir = pathlib.Path(task_dir)
    for k in range(gradings):
        with open_workspace(task_dir / "snapshot", cfg, python_version=task.python_version, task=task) as ws:
            for rel in task.edit_files:
                ws.call("write_file", {"file_path": rel,
                                       "contents": (task_dir / "solution" / rel).read_text(encoding="utf-8")})
            grade = grade_workspace(ws, task, task_dir / "snapshot")
        if not grade.resolved:
            failing = sorted(t for t, r in grade.results.items() if r != "pass")
            if grade.detail:
                why = grade.detail
            elif failing:
                why = f"{len(failing)} test(s) fail, e.g. {failing[0]}: {grade.reasons.get(failing[0], '')}"
            else:
                why = "not resolved"
            return f"the grader does not resolve the reference fix (grading {k + 1} of {gradings}): {why}"[:400]
    return None


def broken_tasks(pool_dir, cfg: EnvConfig, workers: int = 2, split: str = "",
                 progress: bool = True) -> dict[str, str]:
    """{task id: `reference_problem`} for the pool's tasks (of `split` when given) the grader does
    not stand behind."""
    pool = TaskPool(pathlib.Path(pool_dir))
    tasks = [t for t in pool.tasks() if not split or t.split == split]

    def one(task):
        return task.task_id, reference_problem(task, pool.task_dir(task.task_id), cfg)

    with cf.ThreadPoolExecutor(max(1, workers)) as ex:
        found = dict(tqdm(ex.map(one, tasks), total=len(tasks), desc="reference fixes graded",
                          disable=not progress))
    return {k: v for k, v in found.items() if v}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pool", help="a task pool directory (POOL/manifest.json)")
    ap.add_argument("--split", default="", help="only tasks of this split (train, eval)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--remove", action="store_true", help="drop the tasks it finds from the pool")
    args = ap.parse_args(argv)
    if not (pathlib.Path(args.pool) / "manifest.json").is_file():
        ap.error(f"{args.pool}: not a task pool (no manifest.json); build one with "
                 "`python launch.py --experiment=env_ladder` or env_generate")
    pool = TaskPool(pathlib.Path(args.pool))
    checked = sum(1 for t in pool.tasks() if not args.split or t.split == args.split)
    broken = broken_tasks(args.pool, EnvConfig(use_embeddings=False), args.workers, args.split)
    for task_id, why in sorted(broken.items()):
        print(f"{task_id}: {why}")
        if args.remove:
            pool.remove(task_id)
    print(json.dumps({"checked": checked, "broken": len(broken), "removed": len(broken) if args.remove else 0}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
