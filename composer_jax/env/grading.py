"""Grading a workspace against a task by SWE-bench rules, without trusting anything the agent touched.

1. Every process of the episode is killed (the persistent shell, background jobs).
2. The agent's tree is compared with the snapshot (`tamper.collect_changes`): only changes to source
   files are kept; tests, bytecode, start-up hooks, shadowing modules, symlinks and hard links are
   dropped, and the changes a fix never needs are reported as tampering.
3. A fresh copy of the snapshot gets only those changes and is tested in a new sandbox (its own
   uid; every installed copy of the task's files shows the graded version, so nothing reveals the
   reference and tests that import the installed module in a subprocess see the graded code) by
   the isolated runner
   (`python -I -S -B`), whose per-test outcomes count only from the result line carrying the run's
   nonce (`tasks/testrun.py`).
Resolved = every FAIL_TO_PASS and every PASS_TO_PASS test passes, the run is intact and nothing was
tampered with.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import tempfile

from composer_jax.env.sandbox import allocate_uid
from composer_jax.env.tamper import Changes, Rules, collect_changes, stdlib_module_names
from composer_jax.env.tasks.task import Task
from composer_jax.env.tasks.testrun import TestRun, run_tests


@dataclasses.dataclass(frozen=True)
class Grade:
    resolved: bool
    f2p_passed: int
    f2p_total: int
    p2p_passed: int
    p2p_total: int
    results: dict
    ok: bool = True
    tampered: bool = False
    tamper_reasons: tuple = ()
    applied_changes: tuple = ()
    ignored_changes: tuple = ()    # (path, why) pairs the grader did not apply
    detail: str = ""

    @property
    def f2p_fraction(self) -> float:
        return self.f2p_passed / self.f2p_total if self.f2p_total else 0.0

    @property
    def changed_files(self) -> list[str]:
        """Every path the agent changed (applied or not)."""
        return sorted(set(self.applied_changes) | {r for r, _ in self.ignored_changes})


def _reference(task: Task, solution_dir: pathlib.Path | None) -> dict[str, str]:
    if solution_dir is None or not solution_dir.is_dir():
        return {}
    return {r: (solution_dir / r).read_text(encoding="utf-8", errors="replace")
            for r in task.edit_files if (solution_dir / r).is_file()}


def apply_changes(snapshot_dir: pathlib.Path, changes: Changes, target: pathlib.Path,
                  uid: int | None) -> None:
    """Makes `target` a fresh copy of the snapshot with `changes.applied` (owned by `uid`)."""
    shutil.copytree(snapshot_dir, target, symlinks=False)
    for rel, data in changes.applied.items():
        p = target / rel
        if data is None:
            if p.is_file() or p.is_symlink():
                p.unlink()
            continue
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        p.write_bytes(data)
    if uid is not None:
        for p in [target, *target.rglob("*")]:
            os.lchown(p, uid, uid)


def run_graded_copy(ws, snapshot_dir: pathlib.Path, changes: Changes, test_ids,
                    timeout_s: float) -> TestRun:
    """Runs `test_ids` on a fresh snapshot copy with `changes` applied, in a new sandbox."""
    from composer_jax.env.workspace import scratch_parent
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="cj-grade-", dir=scratch_parent()))
    os.chmod(tmp, 0o711)
    sandbox = None
    try:
        uid = allocate_uid()
        apply_changes(pathlib.Path(snapshot_dir), changes, tmp / "ws", uid)
        sandbox = ws.new_sandbox(tmp / "ws", uid, scratch=tmp / "hidden")
        return run_tests(sandbox, ws.python.executable, list(test_ids), timeout_s=timeout_s)
    finally:
        if sandbox is not None:
            sandbox.close()
        shutil.rmtree(tmp, ignore_errors=True)


def grade_workspace(ws, task: Task, snapshot_dir: pathlib.Path, *,
                    solution_dir: pathlib.Path | None = None) -> Grade:
    """Grades `ws` (see the module docstring). `solution_dir` (default: the `solution/` next to
    the snapshot, when present) only keeps the tampering scan from flagging code the reference
    itself contains."""
    snapshot_dir = pathlib.Path(snapshot_dir)
    if solution_dir is None:
        solution_dir = snapshot_dir.parent / "solution"
    ws.stop_processes()
    rules = Rules(frozenset(task.test_files), frozenset(task.edit_files),
                  stdlib_module_names(ws.python.stdlib), _reference(task, pathlib.Path(solution_dir)))
    changes = collect_changes(ws.root, snapshot_dir, rules)
    run = run_graded_copy(ws, snapshot_dir, changes, task.test_ids, ws.config.test_timeout_s)
    tamper = tuple(dict.fromkeys(changes.tamper + run.tamper))
    f2p = sum(run.passed(t) for t in task.fail_to_pass)
    p2p = sum(run.passed(t) for t in task.pass_to_pass)
    resolved = (run.ok and not tamper and f2p == len(task.fail_to_pass)
                and p2p == len(task.pass_to_pass))
    return Grade(resolved, f2p, len(task.fail_to_pass), p2p, len(task.pass_to_pass),
                 dict(run.results), run.ok, bool(tamper), tamper, tuple(sorted(changes.applied)),
                 changes.ignored, run.detail[-500:] if not run.ok else "")
