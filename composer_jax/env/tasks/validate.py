"""Sandboxed test runs for task generation: baselines and the fail-before / pass-after check.

A candidate is (before files, after files, the tests that pass on the after files). It becomes a
task only if, in the sandbox:
  1. a full run of the test module on `before` shows FAIL_TO_PASS (tests passing after, not before)
     non-empty and at most `max_fail_to_pass`;
  2. a targeted run of FAIL_TO_PASS + PASS_TO_PASS on `before` again fails exactly FAIL_TO_PASS;
  3. two targeted runs on `after` pass all of them, each within `max_task_test_seconds` of test
     time (cheap grading keeps RL rollouts fast).
So failing tests fail twice before and pass twice after; any disagreement (flakiness) rejects.
PASS_TO_PASS = every after-passing test of the run's test modules that also passes before (so a
regression anywhere in the touched test modules costs the reward): those in the test classes
FAIL_TO_PASS touches first, then the rest, up to `max_pass_to_pass`; when all of them together
exceed the test-time budget `max_task_test_seconds`, only the FAIL_TO_PASS classes' tests are kept.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import shutil
import tempfile

from composer_jax.env.config import EnvConfig, SandboxBackend
from composer_jax.env.pythons import PythonInstall
from composer_jax.env.sandbox import Limits, Sandbox, allocate_uid, sandbox_python
from composer_jax.env.tasks.testrun import TestRun, TestServer, run_tests
from composer_jax.env.workspace import scratch_parent


class Scratch:
    """A throwaway sandboxed directory to write files into and run tests in."""

    def __init__(self, py: PythonInstall, backend: SandboxBackend, cfg: EnvConfig):
        self.py = sandbox_python(py, backend)
        # Generation runs are short: a candidate whose tests run far longer than the baseline's
        # (e.g. a mutation that loops forever) is cut off early and rejected.
        self.timeout = min(cfg.test_timeout_s, 2 * cfg.max_test_file_seconds + 2)
        self._tmp = pathlib.Path(tempfile.mkdtemp(prefix="cj-gen-", dir=scratch_parent()))
        os.chmod(self._tmp, 0o711)
        self.dir = self._tmp / "ws"
        self.dir.mkdir()
        self.uid = allocate_uid()
        if self.uid is not None:
            os.chown(self.dir, self.uid, self.uid)
        limits = dataclasses.replace(Limits.from_config(cfg), timeout_s=cfg.test_timeout_s)
        self.sandbox = Sandbox(self.dir, backend=backend, limits=limits,
                               python_prefixes=(self.py.prefix,), uid=self.uid)
        self.server = TestServer(self.sandbox, self.py.executable) if cfg.fork_server else None
        self._synced: set[str] = set()

    def sync(self, files: dict[str, str]) -> None:
        """Makes the directory hold `files` and nothing else we wrote before: when the set of
        paths differs from the last sync, the directory is emptied first (a mutated module left
        over from another candidate must not shadow the library for the next one)."""
        if set(files) != self._synced:
            for entry in list(self.dir.iterdir()):
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
            self._synced = set(files)
        self.write(files)

    def write(self, files: dict[str, str]) -> None:
        """Writes (overwrites) `files`; other files stay."""
        for rel, text in files.items():
            p = self.dir / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text, encoding="utf-8")
            if self.uid is not None:
                os.chown(p, self.uid, self.uid)

    def run(self, names, modules=(), timeout_s: float | None = None) -> TestRun:
        """Runs test `names` here; `timeout_s` defaults to the short generation timeout."""
        timeout = timeout_s or self.timeout
        if self.server is not None:
            run = self.server.run(names, modules=modules, timeout_s=timeout)
            if run.ok or run.detail != "eof":
                return run
            # The server itself died (tests run in its forks): rerun directly, so the failure's
            # detail is the interpreter's own output rather than "eof".
        return run_tests(self.sandbox, self.py.executable, names, modules=modules,
                         timeout_s=timeout)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        self.sandbox.close()
        shutil.rmtree(self._tmp, ignore_errors=True)


@contextlib.contextmanager
def scratch(py: PythonInstall, backend: SandboxBackend, cfg: EnvConfig):
    s = Scratch(py, backend, cfg)
    try:
        yield s
    finally:
        s.close()


def addressable(test_id: str, test_modules) -> bool:
    """Ids we can re-run by name: `<one of test_modules>.Class.method`."""
    return any(test_id.startswith(m + ".") and test_id[len(m) + 1:].count(".") == 1
               for m in test_modules)


@dataclasses.dataclass(frozen=True)
class Verdict:
    accepted: bool
    reason: str
    fail_to_pass: tuple[str, ...] = ()
    pass_to_pass: tuple[str, ...] = ()
    messages: dict = dataclasses.field(default_factory=dict)


def pass_to_pass(after_passing, full: TestRun, f2p, limit: int) -> tuple[tuple, tuple]:
    """(every after-passing test that passes in `full`, F2P classes first, up to `limit`; only
    those in the F2P classes)."""
    classes = {t.rsplit(".", 1)[0] for t in f2p}
    ok = sorted(t for t in after_passing if full.passed(t))
    near = [t for t in ok if t.rsplit(".", 1)[0] in classes]
    far = [t for t in ok if t.rsplit(".", 1)[0] not in classes]
    return tuple(sorted((near + far)[:limit])), tuple(sorted(near[:limit]))


def check_candidate(sx: Scratch, test_names, before: dict[str, str], after: dict[str, str],
                    after_passing: frozenset[str], cfg: EnvConfig,
                    max_fail_to_pass: int | None = None) -> Verdict:
    """Runs the protocol in the module docstring; `test_names` (test modules or classes) make the
    full run; `sx` is reused (synced to `before`, then `after`). `max_fail_to_pass` defaults to
    `cfg.max_fail_to_pass`."""
    cap = max_fail_to_pass or cfg.max_fail_to_pass
    sx.sync(before)
    full = sx.run(list(test_names))
    if not full.ok:
        return Verdict(False, f"before-run crashed: {full.detail[-200:]}")
    f2p = tuple(sorted(t for t in after_passing if not full.passed(t)))
    if not f2p:
        return Verdict(False, "no test fails before the fix")
    if len(f2p) > cap:
        return Verdict(False, f"{len(f2p)} failing tests > max_fail_to_pass")
    wide, narrow = pass_to_pass(after_passing, full, f2p, cfg.max_pass_to_pass)
    options = [wide] if wide == narrow else [wide, narrow]
    reason = ""
    for p2p in options:
        ids = list(f2p + p2p)
        again = sx.run(ids)
        if not again.ok or any(again.passed(t) for t in f2p) or \
                not all(again.passed(t) for t in p2p):
            return Verdict(False, "flaky: second before-run disagrees")
        if again.test_seconds > cfg.max_task_test_seconds and p2p is not options[-1]:
            continue  # too slow with every test: keep the F2P classes' tests only
        sx.sync(after)
        reason = ""
        for _ in range(2):
            post = sx.run(ids)
            if not post.ok or not all(post.passed(t) for t in ids):
                return Verdict(False, "not all tests pass after the reference fix")
            if post.test_seconds > cfg.max_task_test_seconds:
                reason = f"task tests too slow: {post.test_seconds:.2f}s"
                break
        if not reason:
            return Verdict(True, "ok", f2p, p2p, {t: full.messages.get(t, "") for t in f2p})
        sx.sync(before)
    return Verdict(False, reason or "task tests too slow")
