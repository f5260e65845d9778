"""Running a task's tests on a tree through the graded test process, and the reference run cache.

`run_tree(ws, task, tree, ...)` starts a fresh sandbox over `tree` (its own uid) in which
`python -m unittest ID...` runs `graded_unittest.py` (bound over the interpreter's
`unittest/__main__.py`), sends it the run's nonce on stdin and returns its raw output; the parent
reads and judges it in a bounded process (`bounded.py`). The tests are always the task's grading
copies (`task.grading_test_files`: held-back tests included). `reference(ws, task, task_dir)` is
the same run, twice, on the snapshot with the reference solution applied - no agent code -
summarised per test (`verdict.reference_summary`: values alike in both runs are pinned) and cached
in memory and in `<task_dir>/.grader/` (keyed by everything it depends on).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import pathlib
import secrets
import shlex
import shutil
import subprocess
import tempfile
import threading

from composer_jax.env.bounded import EvaluationOverrun, summarise_outputs
from composer_jax.env.config import SandboxBackend
from composer_jax.env.sandbox import allocate_uid, reap_uid
from composer_jax.env.tasks.task import Task, grading_test_files
from composer_jax.env.verdict import SUMMARY_VERSION, read_records
from composer_jax.env.workspace import scratch_parent

HARNESS = pathlib.Path(__file__).resolve().parent / "graded_unittest.py"
OUTPUT_BYTES = 32 << 20
GRACE_S = 0.1     # a graded run may take GRACE_S + FACTOR x the reference's time
FACTOR = 3.0      # and write GRACE_BYTES + FACTOR x what the reference wrote
OVERLOADED = 1.0  # runnable threads per CPU above which an overrun is retried (`run_with_one_retry`)
GRACE_BYTES = 64 << 10
# What the graded process imports before any test: its own modules and those of `python -m`.
HARNESS_IMPORTS = ("runpy", "unittest", "unittest.main", "json", "ast", "importlib.machinery",
                   "importlib.util")


@dataclasses.dataclass(frozen=True)
class GradedRun:
    """output: what the graded process wrote (untrusted); nonce: the run's secret; timed_out;
    duration_s. The parent judges `output` in a bounded process (`bounded.judge_output`)."""
    output: str
    nonce: str
    timed_out: bool
    duration_s: float

    @property
    def records(self) -> dict:
        """test id -> record, parsed in this process (for tests and diagnostics only)."""
        return read_records(self.output, self.nonce)[0]

    @property
    def detail(self) -> str:
        return "timed out" if self.timed_out else self.output[-2000:]


def module_name(rel: str) -> str:
    """"pkg/tests/test_x.py" -> "pkg.tests.test_x"; "pkg/__init__.py" -> "pkg"."""
    parts = rel[:-3].split("/") if rel.endswith(".py") else rel.split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


@functools.lru_cache(maxsize=None)
def _harness_text() -> bytes:
    return HARNESS.read_bytes()


@functools.lru_cache(maxsize=None)
def imported_before_tests(python_exe: str) -> frozenset:
    """Files the graded process has imported before the tests (`HARNESS_IMPORTS` with their
    dependencies), for the task's interpreter."""
    code = ("import sys\n" + "".join(f"import {m}\n" for m in HARNESS_IMPORTS) +
            "print('\\n'.join(getattr(m, '__file__', None) or '' for m in list(sys.modules.values())))")
    try:
        out = subprocess.run([python_exe, "-I", "-c", code], capture_output=True, text=True,
                             timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    return frozenset(x for x in out.splitlines() if x)


def trusted_edit_files(task: Task, python_exe: str) -> frozenset:
    """Edit files whose installed copy the graded process imports before the tests."""
    files = imported_before_tests(python_exe)
    return frozenset(r for r in task.edit_files if any(f.endswith("/" + r) for f in files))


def _staged_harness(scratch: pathlib.Path) -> pathlib.Path:
    scratch.mkdir(parents=True, exist_ok=True)
    os.chmod(scratch, 0o755)
    p = scratch / "unittest_main.py"
    p.write_bytes(_harness_text())
    os.chmod(p, 0o644)
    return p


def run_tree(ws, task: Task, tree: pathlib.Path, uid, scratch: pathlib.Path,
             timeout_s: float, max_output_bytes: int = OUTPUT_BYTES) -> GradedRun:
    """Runs the task's tests on `tree` in a fresh sandbox (module docstring)."""
    harness = _staged_harness(scratch)
    trusted = trusted_edit_files(task, ws.python.executable)
    main_py = pathlib.Path(ws.python.stdlib) / "unittest" / "__main__.py"
    sandbox = ws.new_sandbox(tree, uid, scratch=scratch / "hidden", trusted=trusted,
                             extra_overlays=((str(harness), str(main_py)),))
    try:
        ids = list(task.test_ids)
        if sandbox.backend == SandboxBackend.BWRAP:
            exe = "python" if (pathlib.Path(ws.python.prefix) / "bin" / "python").exists() \
                else ws.python.executable  # what `python` means in the agent's shell
            # An edit file that `python -m unittest` imports itself would run agent code before
            # the graded process is set up (the working directory leads sys.path): then the
            # working directory is left out at start-up (-P, or -I before 3.11) and the graded
            # process puts it back once set up - a run distinguishable by sys.flags, the price.
            safe = ["-P" if tuple(map(int, ws.python.version.split("."))) >= (3, 11) else "-I"] \
                if trusted else []
            argv = [exe, *safe, "-m", "unittest", *ids]
        else:  # no overlays without bubblewrap: the process runs the harness as a script
            argv = [ws.python.executable, str(harness), *ids]
        nonce = secrets.token_hex(16)
        req = json.dumps({"nonce": nonce,
                          "modules": sorted({module_name(r) for r in task.test_files
                                             if r.endswith(".py")}),
                          "edited": sorted({module_name(r) for r in task.edit_files})})
        r = sandbox.run(" ".join(shlex.quote(a) for a in argv), timeout_s=timeout_s,
                        max_output_bytes=max_output_bytes, stdin_data=(req + "\n").encode())
    finally:
        sandbox.close()
        reap_uid(uid)  # its processes are gone before anyone judges the machine's load
    return GradedRun(r.output, nonce, r.timed_out, r.duration_s)


def copy_tree(snapshot: pathlib.Path, files: dict, target: pathlib.Path, uid) -> None:
    """`target` = a fresh copy of `snapshot` with `files` (rel -> bytes) written over it."""
    shutil.copytree(snapshot, target, symlinks=False)
    for rel, data in files.items():
        p = target / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    if uid is not None:
        for p in [target, *target.rglob("*")]:
            os.lchown(p, uid, uid)


def run_files(ws, task: Task, snapshot: pathlib.Path, files: dict, timeout_s: float,
              max_output_bytes: int = OUTPUT_BYTES) -> GradedRun:
    """`run_tree` on a fresh snapshot copy with `files` applied, in a scratch directory."""
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="cj-grade-", dir=scratch_parent()))
    os.chmod(tmp, 0o711)
    try:
        uid = allocate_uid()
        copy_tree(pathlib.Path(snapshot), files, tmp / "ws", uid)
        return run_tree(ws, task, tmp / "ws", uid, tmp / "scratch", timeout_s, max_output_bytes)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


_CACHE: dict[str, dict] = {}
_LOCKS: dict[str, threading.Lock] = {}
_LOCK = threading.Lock()


def _reference_key(ws, task: Task, snapshot: pathlib.Path, solution: dict) -> str:
    h = hashlib.sha256()
    for part in (_harness_text(), task.task_id.encode(), ws.python.executable.encode(),
                 ws.python.full_version.encode(),
                 json.dumps(task.test_ids).encode(), ws.backend.value.encode(),
                 str(SUMMARY_VERSION).encode()):
        h.update(hashlib.sha256(part).digest())
    for rel, data in sorted(grading_test_files(task, snapshot.parent).items()):
        h.update(rel.encode() + b"\0" + data)
    for rel in sorted(solution):
        h.update(rel.encode() + b"\1" + solution[rel])
    return h.hexdigest()


@dataclasses.dataclass(frozen=True)
class Reference:
    """summary: test id -> `reference_summary`; seconds: the faster of its two runs (the first
    may pay cold caches), as on an idle machine; output_bytes: the larger of the two (a graded
    run's budgets scale with them: `budget_s`, `budget_bytes`)."""
    summary: dict
    seconds: float = 0.0
    output_bytes: int = 0


def slowdown() -> float:
    """How much slower than idle this machine runs now: the 1-minute load per CPU, at least 1."""
    try:
        return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
    except OSError:
        return 1.0


def runnable_now() -> int:
    """Threads runnable on the machine at this instant (/proc/loadavg's 4th field; 0 where there is
    none)."""
    try:
        with open("/proc/loadavg") as f:
            return int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return 0


def runnable_per_cpu() -> float:
    """`runnable_now` per CPU: how overloaded the machine is at this instant."""
    return runnable_now() / (os.cpu_count() or 1)


def budget_slowdown() -> float:
    """The slowdown a retried graded run's time limit is scaled by (`run_with_one_retry`): the
    larger of `slowdown` (the 1-minute load, which lags a burst by tens of seconds) and
    `runnable_per_cpu`."""
    return max(slowdown(), runnable_per_cpu())


def budget_s(reference_seconds: float, cap_s: float, slow: float | None = None) -> float:
    """A graded run's time limit: GRACE_S + FACTOR x the reference's time (stored as on an idle
    machine, scaled by `slow`, default the current `slowdown`), at most `cap_s`. A correct fix
    much slower than the reference fails; an endless loop costs little more than an honest
    grading."""
    if not reference_seconds:
        return cap_s
    return min(cap_s, GRACE_S + FACTOR * reference_seconds * (slowdown() if slow is None else slow))


def run_with_one_retry(run_once, reference_seconds: float, cap_s: float):
    """run_once(budget_s(reference_seconds, cap_s)) -> a result with `timed_out`. A burst of load
    (a rollout group graded at once beside training threads) can stretch an honest run past its
    budget before the 1-minute load notices; so when a run overran while the machine is
    overloaded right now (more runnable threads than CPUs just after the overrun, the caller
    standing in for the finished run: runnable threads per CPU > OVERLOADED; the 1-minute load
    is not asked, it stays high long after a burst), it runs once more with twice a budget
    scaled by `budget_slowdown` (at most `cap_s`). The run's own processes are gone by then
    (`sandbox.reap_uid`), so it cannot cause its retry. Where a CPU was free an endless loop
    still costs one budget; on an overloaded machine, that and the retry's."""
    result = run_once(budget_s(reference_seconds, cap_s))
    if result.timed_out and runnable_per_cpu() > OVERLOADED:
        result = run_once(min(cap_s, 2 * budget_s(reference_seconds, cap_s, budget_slowdown())))
    return result


def budget_bytes(reference_bytes: int, cap: int = OUTPUT_BYTES) -> int:
    """A graded run's output limit: GRACE_BYTES + FACTOR x what the reference wrote (so the
    parent's reading and judging costs a bounded multiple of an honest run's)."""
    return min(cap, GRACE_BYTES + int(FACTOR * reference_bytes)) if reference_bytes else cap


def reference(ws, task: Task, task_dir: pathlib.Path, timeout_s: float) -> Reference | None:
    """The reference solution's run, summarised (cached; see module doc). An empty summary when
    the task has no solution directory; None when the reference run did not finish (then
    nothing can be verified and the grading fails)."""
    task_dir = pathlib.Path(task_dir)
    snapshot, sol_dir = task_dir / "snapshot", task_dir / "solution"
    solution = {r: (sol_dir / r).read_bytes() for r in task.edit_files if (sol_dir / r).is_file()}
    if not solution:
        return Reference({})
    tests = grading_test_files(task, task_dir)
    key = _reference_key(ws, task, snapshot, solution)
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
        lock = _LOCKS.setdefault(key, threading.Lock())
    with lock:
        if key in _CACHE:
            return _CACHE[key]
        path = task_dir / ".grader" / f"reference-{key[:32]}.json"
        stored = None
        try:
            stored = json.loads(path.read_text())
        except (OSError, ValueError):
            pass
        if not isinstance(stored, dict) or "summary" not in stored:  # two runs: values alike
            run = run_files(ws, task, snapshot, {**tests, **solution}, timeout_s)  # are pinned
            again = run_files(ws, task, snapshot, {**tests, **solution}, timeout_s)
            try:
                out = summarise_outputs(run.output, again.output, run.nonce, again.nonce,
                                        task.test_ids)
            except EvaluationOverrun as exc:
                out = {"finished": False, "summary": {}, "why": str(exc)}
            if not out["finished"] or run.timed_out or again.timed_out:
                logging.getLogger(__name__).warning(
                    "the reference run of %s did not finish (%s); grading fails until it does",
                    task.task_id, out.get("why") or run.detail[-300:] or "no final line")
                return None
            stored = {"summary": out["summary"],
                      "seconds": min(run.duration_s, again.duration_s) / slowdown(),
                      "output_bytes": max(len(run.output), len(again.output))}
            _store(path, stored)
        ref = Reference(stored["summary"], float(stored.get("seconds", 0.0)),
                        int(stored.get("output_bytes", 0)))
        _CACHE[key] = ref
        return ref


def _store(path: pathlib.Path, summary: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix="." + path.name)
        with os.fdopen(fd, "w") as f:
            json.dump(summary, f)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only pool: the in-memory cache still holds it
