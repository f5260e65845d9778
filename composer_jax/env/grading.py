"""Grading a workspace against a task by SWE-bench rules.

Before running, the task's test files are restored from the snapshot (an agent cannot pass by
editing tests). Resolved = every FAIL_TO_PASS and every PASS_TO_PASS test passes.
"""
from __future__ import annotations

import dataclasses
import pathlib
import shutil

from composer_jax.env.tasks.task import Task
from composer_jax.env.tasks.testrun import run_tests
from composer_jax.env.tools.files import write_text


@dataclasses.dataclass(frozen=True)
class Grade:
    resolved: bool
    f2p_passed: int
    f2p_total: int
    p2p_passed: int
    p2p_total: int
    results: dict
    ok: bool = True

    @property
    def f2p_fraction(self) -> float:
        return self.f2p_passed / self.f2p_total if self.f2p_total else 0.0


def grade_workspace(ws, task: Task, snapshot_dir: pathlib.Path) -> Grade:
    """Restores the test files, runs FAIL_TO_PASS + PASS_TO_PASS in the sandbox, scores them."""
    for rel in task.test_files:
        target = ws.root / rel
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.is_dir():
            shutil.rmtree(target)
        write_text(ws, target, (pathlib.Path(snapshot_dir) / rel).read_text(encoding="utf-8"))
    run = run_tests(ws.sandbox, ws.python.executable, list(task.test_ids),
                    timeout_s=ws.config.test_timeout_s)
    f2p = sum(run.passed(t) for t in task.fail_to_pass)
    p2p = sum(run.passed(t) for t in task.pass_to_pass)
    resolved = run.ok and f2p == len(task.fail_to_pass) and p2p == len(task.pass_to_pass)
    return Grade(resolved, f2p, len(task.fail_to_pass), p2p, len(task.pass_to_pass),
                 dict(run.results), run.ok)
