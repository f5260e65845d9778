"""Grading a workspace against a task: the verdict is computed here, never in a process that runs
agent code (the argument and its limits: README, "Threat model").

1. Every process of the episode is killed (the persistent shell, background jobs).
2. `tamper.collect_changes`: only the agent's versions of the snapshot's own source files are kept
   (UTF-8, bounded size); tests, new files, bytecode, hooks, links, data files are dropped and
   logged, not penalised. The token scan of the kept edits is defence in depth.
3. A fresh copy of the snapshot gets those edits - the tests are the snapshot's - and runs
   `python -m unittest ID...` in a new sandbox (own uid; installed copies of the task's files
   show the graded version, except those the test process imports before the tests, which stay
   the snapshot's), through the graded test process (`graded_unittest.py`), which records what
   every assertion of the trusted tests compared.
4. `verdict.judge` decides each test in this process: the parent re-evaluates the recorded
   assertions itself and requires every assertion site the reference run (reference fix, same
   tests, no agent code; `graded_run.reference`, cached per task) verified; the child's own
   status can only lower the verdict.
Resolved = every FAIL_TO_PASS and PASS_TO_PASS test passes that judgement and nothing was tampered
with. Tampering = a forged report (the child claims a pass the parent's evaluation refutes, or a
second record for a test under the run's secret nonce) or a scan finding.
"""
from __future__ import annotations

import dataclasses
import pathlib

from composer_jax.env.graded_run import reference, run_files
from composer_jax.env.tamper import (BudgetExceeded, Budget, Changes, Rules, collect_changes,
                                     stdlib_module_names)
from composer_jax.env.tasks.task import Task
from composer_jax.env.verdict import judge


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
    reasons: dict = dataclasses.field(default_factory=dict)   # test id -> why it failed
    verified_sites: int = 0        # assertion sites the parent evaluated itself
    edited_files: tuple = ()       # snapshot files the agent changed or deleted

    @property
    def f2p_fraction(self) -> float:
        return self.f2p_passed / self.f2p_total if self.f2p_total else 0.0

    @property
    def changed_files(self) -> list[str]:
        """The snapshot's files the agent changed or deleted (applied or not); new files - build
        artefacts, venvs, backups, scratch scripts - are not edits (`ignored_changes` lists them)."""
        return sorted(set(self.applied_changes) | set(self.edited_files))


def _reference_texts(task: Task, solution_dir: pathlib.Path | None) -> dict[str, str]:
    if solution_dir is None or not solution_dir.is_dir():
        return {}
    return {r: (solution_dir / r).read_text(encoding="utf-8", errors="replace")
            for r in task.edit_files if (solution_dir / r).is_file()}


def _failed(task: Task, changes: Changes, why: str) -> Grade:
    return Grade(False, 0, len(task.fail_to_pass), 0, len(task.pass_to_pass), {}, ok=False,
                 applied_changes=tuple(sorted(changes.applied)), ignored_changes=changes.ignored,
                 detail=why, edited_files=changes.edited)


def grade_workspace(ws, task: Task, snapshot_dir: pathlib.Path, *,
                    solution_dir: pathlib.Path | None = None) -> Grade:
    """Grades `ws` (see the module docstring). `solution_dir` (default: the `solution/` next to
    the snapshot) is the reference fix: its run sets which assertion sites each test must reach,
    and the scan does not flag code it contains."""
    snapshot_dir = pathlib.Path(snapshot_dir)
    task_dir = snapshot_dir.parent
    if solution_dir is None:
        solution_dir = task_dir / "solution"
    ws.stop_processes()
    rules = Rules(frozenset(task.test_files), frozenset(task.edit_files),
                  stdlib_module_names(ws.python.stdlib),
                  _reference_texts(task, pathlib.Path(solution_dir)))
    try:
        changes = collect_changes(ws.root, snapshot_dir, rules, Budget())
    except BudgetExceeded as exc:
        return _failed(task, Changes({}, (), ()), f"grading budget exceeded: {exc}")
    timeout = ws.config.test_timeout_s
    ref = reference(ws, task, task_dir, timeout) if pathlib.Path(solution_dir) == task_dir / \
        "solution" else {}
    run = run_files(ws, task, snapshot_dir, changes.applied, timeout)
    results, reasons, tamper, verified = {}, {}, list(changes.tamper), 0
    for tid in task.test_ids:
        v = judge(run.records.get(tid), ref.get(tid))
        results[tid] = "pass" if v.passed else "fail"
        verified += v.verified_sites
        if not v.passed:
            reasons[tid] = v.reason
        if v.forged:
            tamper.append(f"forged result for {tid}: {v.reason}")
    if any(n.startswith("two records") for n in run.notes):
        tamper.append("a second result record under the run's secret nonce")
    tamper = tuple(dict.fromkeys(tamper))
    f2p = sum(results[t] == "pass" for t in task.fail_to_pass)
    p2p = sum(results[t] == "pass" for t in task.pass_to_pass)
    ok = run.finished
    resolved = (ok and not tamper and f2p == len(task.fail_to_pass)
                and p2p == len(task.pass_to_pass))
    detail = run.detail[-500:] if not ok else ""
    return Grade(resolved, f2p, len(task.fail_to_pass), p2p, len(task.pass_to_pass), results, ok,
                 bool(tamper), tamper, tuple(sorted(changes.applied)), changes.ignored, detail,
                 reasons, verified, changes.edited)
