"""Grading a workspace against a task, after the episode, from the agent's diff. The verdict is
computed here, never in a process that runs agent code (the argument and its limits:
docs/grader.md).

1. Every process of the episode is killed (the persistent shell, background jobs).
2. `tamper.collect_changes`: the agent's versions of the snapshot's own source files and new
   modules inside the task's package are kept (UTF-8, bounded size); tests, bytecode, hooks,
   links and data files are dropped and logged, never penalised.
3. A fresh copy of the snapshot gets those changes and the task's grading tests (held-back tests
   included, `task.grading_test_files`) and runs `python -m unittest ID...` in a new sandbox
   through the graded test process (`graded_unittest.py`), which records what every assertion of
   the trusted tests compared.
4. The parent judges each test in a bounded process (`bounded.judge_output`, `verdict.judge`):
   it re-evaluates the recorded assertions itself and requires every assertion site the
   reference run verified; no flag the child writes relaxes a check.
5. Secret cases (`secret.check`): another fresh process over another fresh copy receives only
   inputs recorded from the reference at build time and prints the outputs; the parent compares.
Resolved = every FAIL_TO_PASS and PASS_TO_PASS test passes that judgement and every secret case
matches. Tampering = only a forged report: the child claims a pass the parent's evaluation refutes.
"""
from __future__ import annotations

import dataclasses
import pathlib
import time

from composer_jax.env.bounded import EvaluationOverrun, judge_output
from composer_jax.env.graded_run import (Reference, budget_bytes, reference, run_files,
                                         run_with_one_retry)
from composer_jax.env.secret import check as check_secret_cases
from composer_jax.env.tamper import (BudgetExceeded, Budget, Changes, Rules, collect_changes,
                                     stdlib_module_names)
from composer_jax.env.tasks.task import Task, grading_test_files


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
    secret_total: int = 0          # secret cases checked
    secret_passed: int = 0
    seconds: float = 0.0           # grading wall time

    @property
    def f2p_fraction(self) -> float:
        return self.f2p_passed / self.f2p_total if self.f2p_total else 0.0

    added_modules: tuple = ()      # new modules applied (inside the task's package)

    @property
    def changed_files(self) -> list[str]:
        """The snapshot's files the agent changed or deleted (applied or not); new files - build
        artefacts, venvs, backups, scratch scripts, new modules - are not edits of the snapshot
        (`ignored_changes` and `added_modules` list them)."""
        return sorted(set(self.edited_files)
                      | (set(self.applied_changes) - set(self.added_modules)))


def _failed(task: Task, changes: Changes, why: str, start: float) -> Grade:
    return Grade(False, 0, len(task.fail_to_pass), 0, len(task.pass_to_pass), {}, ok=False,
                 applied_changes=tuple(sorted(changes.applied)), ignored_changes=changes.ignored,
                 detail=why, edited_files=changes.edited, seconds=time.monotonic() - start)


def grade_workspace(ws, task: Task, snapshot_dir: pathlib.Path, *,
                    solution_dir: pathlib.Path | None = None) -> Grade:
    """Grades `ws` (see the module docstring). `solution_dir` (default: the `solution/` next to
    the snapshot) is the reference fix: its run sets which assertion sites each test must reach;
    secret cases are checked only against the task's own reference."""
    start = time.monotonic()
    snapshot_dir = pathlib.Path(snapshot_dir)
    task_dir = snapshot_dir.parent
    own = solution_dir is None or pathlib.Path(solution_dir) == task_dir / "solution"
    ws.stop_processes()
    rules = Rules(frozenset(task.test_files), frozenset(task.edit_files),
                  stdlib_module_names(ws.python.stdlib))
    try:
        changes = collect_changes(ws.root, snapshot_dir, rules, Budget())
    except BudgetExceeded as exc:
        return _failed(task, Changes({}, (), ()), f"grading budget exceeded: {exc}", start)
    cap = ws.config.test_timeout_s
    ref = reference(ws, task, task_dir, cap) if own else Reference({})
    if ref is None:
        return _failed(task, changes, "the reference run did not finish: nothing to verify",
                       start)
    files = {**grading_test_files(task, task_dir), **changes.applied}
    out_bytes = budget_bytes(ref.output_bytes)
    run = run_with_one_retry(lambda b: run_files(ws, task, snapshot_dir, files, b, out_bytes),
                             ref.seconds, cap)
    try:
        judged = judge_output(run.output, run.nonce, ref.summary, task.test_ids)
    except EvaluationOverrun as exc:
        return _failed(task, changes, f"grading budget exceeded: {exc}", start)
    results, reasons, tamper, verified = {}, {}, [], 0
    for tid in task.test_ids:
        passed, reason, forged, sites = judged["verdicts"][tid]
        results[tid] = "pass" if passed else "fail"
        verified += sites
        if not passed:
            reasons[tid] = reason
        if forged:
            tamper.append(f"forged result for {tid}: {reason}")
    tamper = tuple(dict.fromkeys(tamper))
    f2p = sum(results[t] == "pass" for t in task.fail_to_pass)
    p2p = sum(results[t] == "pass" for t in task.pass_to_pass)
    ok = judged["finished"] and not run.timed_out
    detail = "" if ok else run.detail[-500:]
    secret = check_secret_cases(ws, task, task_dir, files, cap) if own and ok else None
    secret_ok = secret is None or secret.ok
    if secret is not None and not secret.ok:
        detail = (detail + "; " if detail else "") + (
            secret.detail or f"secret cases: {secret.passed} of {secret.total} outputs match "
                             f"the reference")
    resolved = (ok and secret_ok and not tamper and f2p == len(task.fail_to_pass)
                and p2p == len(task.pass_to_pass))
    return Grade(resolved, f2p, len(task.fail_to_pass), p2p, len(task.pass_to_pass), results, ok,
                 bool(tamper), tamper, tuple(sorted(changes.applied)), changes.ignored, detail,
                 reasons, verified, changes.edited,
                 secret.total if secret else 0, secret.passed if secret else 0,
                 time.monotonic() - start, changes.added)
