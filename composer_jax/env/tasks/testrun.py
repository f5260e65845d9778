"""Running unittest ids in a sandbox with a task's interpreter, and reading back per-test outcomes.

`run_tests` starts a fresh sandbox and interpreter per run; `TestServer` keeps one warm, sandboxed
fork server per scratch directory. Both serve task generation and benchmarks, where no agent code
runs. Episodes are graded differently: the verdict is computed outside the test process from
recorded assertion values (`composer_jax.env.grading`, `graded_run`, `verdict`); the integrity
checks below are only a consistency check for generation.

The runner runs isolated (`python -I -S -B`: no start-up hooks, no current directory or PYTHON*
variables at start, no bytecode written) and answers with one line `@@CJ_RESULTS@@<nonce>:{json}`.
The nonce is fresh per run and reaches the runner on stdin, before any workspace code is imported;
only the line carrying it counts. Other result lines (printed by the code under test) are forgeries:
they are listed in `TestRun.tamper`, as are the runner's integrity findings (unittest, the runner,
builtins or the test classes replaced while the tests ran); a run with either is not `ok`.
"""
from __future__ import annotations

import dataclasses
import json
import secrets
import shlex
import subprocess
import time

from composer_jax.env.procio import close_process, drain
from composer_jax.env.sandbox import Sandbox

MARKER = "@@CJ_RESULTS@@"
RUNNER = "unittest_runner.py"
RESULT_BYTES = 4 << 20


@dataclasses.dataclass(frozen=True)
class TestRun:
    """Outcome of one run: `results` maps test id -> pass/fail/error/skip; `ok` is False when the
    runner itself did not report (crash, timeout), in which case every requested id counts as
    failed; `modules` maps module name -> file it was imported from; `duration_s` is the wall time
    seen from the host, `test_seconds` the time spent running tests inside the interpreter,
    `class_times` maps test class id -> seconds its tests took (to pick fast tests); `tamper` lists
    forged result lines and integrity violations (then `ok` is False)."""
    ok: bool
    results: dict
    messages: dict
    modules: dict
    duration_s: float
    detail: str = ""
    test_seconds: float = 0.0
    class_times: dict = dataclasses.field(default_factory=dict)
    tamper: tuple = ()

    def passed(self, test_id: str) -> bool:
        return self.results.get(test_id) == "pass"


def runner_command(python_exe: str, assets_dir: str, names, modules=()) -> str:
    """The shell command running `names` through the runner with `python_exe -I -S -B`."""
    args = [python_exe, "-I", "-S", "-B", f"{assets_dir}/{RUNNER}"]
    for m in modules:
        args += ["--module", m]
    return " ".join(shlex.quote(a) for a in args + list(names))


def parse_output(text: str, duration_s: float, nonce: str = "") -> TestRun:
    """Reads the runner's result line carrying `nonce`; other marker lines are forgeries (listed in
    `tamper`); a missing line yields ok=False with the tail as detail."""
    genuine, forged = None, []
    for chunk in text.split(MARKER)[1:]:
        line = chunk.split("\n", 1)[0]
        tag, sep, body = line.partition(":")
        if sep and tag == nonce and genuine is None:
            genuine = body
        else:
            forged.append("a result line without the run's nonce was printed")
    tamper = tuple(dict.fromkeys(forged))
    if genuine is None:
        return TestRun(False, {}, {}, {}, duration_s, detail=text[-2000:], tamper=tamper)
    try:
        data = json.loads(genuine)
    except json.JSONDecodeError:
        return TestRun(False, {}, {}, {}, duration_s, detail="unparsable runner output",
                       tamper=tamper)
    if "error" in data:
        return TestRun(False, {}, {}, {}, duration_s, detail=str(data["error"]), tamper=tamper)
    tamper += tuple(f"integrity: {x}" for x in data.get("integrity", ()))
    return TestRun(not tamper, data.get("results", {}), data.get("messages", {}),
                   data.get("modules", {}), duration_s,
                   detail="tampering: " + "; ".join(tamper[:5]) if tamper else "",
                   test_seconds=float(data.get("duration", 0.0)),
                   class_times=data.get("class_times", {}), tamper=tamper)


def new_nonce() -> str:
    """A fresh per-run secret for the result line."""
    return secrets.token_hex(16)


def run_tests(sandbox: Sandbox, python_exe: str, names, *, modules=(),
              timeout_s: float = 60.0) -> TestRun:
    """Runs test `names` (module, class or test ids) inside `sandbox`'s workspace."""
    cmd = runner_command(python_exe, sandbox.assets, names, modules)
    nonce = new_nonce()
    r = sandbox.run(cmd, timeout_s=timeout_s, max_output_bytes=RESULT_BYTES,
                    stdin_data=(nonce + "\n").encode())
    run = parse_output(r.output, r.duration_s, nonce)
    if r.timed_out:
        return dataclasses.replace(run, ok=False, detail=f"timed out after {timeout_s:g}s")
    return run


class TestServer:
    """A warm test runner in a long-lived sandbox: each run forks from an interpreter that has
    already imported unittest and test.support (the runner's `--serve` mode), which saves the
    sandbox and interpreter start-up per run. A run that times out kills the whole sandbox; the
    next run starts a fresh one."""

    def __init__(self, sandbox: Sandbox, python_exe: str):
        self.sandbox = sandbox
        self.python_exe = python_exe
        self._proc = None

    def _start(self):
        cmd = f"exec {shlex.quote(self.python_exe)} -I -S -B {self.sandbox.assets}/{RUNNER} --serve"
        return subprocess.Popen(self.sandbox.argv(cmd), env=self.sandbox.env(),
                                cwd=str(self.sandbox.host_dir), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)

    def run(self, names, *, modules=(), timeout_s: float = 60.0) -> TestRun:
        if self._proc is None or self._proc.poll() is not None:
            self.close()
            self._proc = self._start()
        start = time.monotonic()
        nonce = new_nonce()
        req = json.dumps({"names": list(names), "modules": list(modules), "nonce": nonce}) + "\n"
        try:
            self._proc.stdin.write(req.encode())
            self._proc.stdin.flush()
        except BrokenPipeError:
            self.close()
            return TestRun(False, {}, {}, {}, 0.0, detail="test server died")
        _, _, why, line = drain(self._proc.stdout.fileno(), start + timeout_s, 1 << 16,
                                kill_after_bytes=64 << 20, stop_marker=MARKER.encode())
        duration = time.monotonic() - start
        if why != "marker":
            self.close()
            return TestRun(False, {}, {}, {}, duration,
                           detail=f"timed out after {timeout_s:g}s" if why == "timeout" else why)
        return parse_output(line.decode("utf-8", errors="replace"), duration, nonce)

    def close(self) -> None:
        if self._proc is not None:
            close_process(self._proc)
            self._proc = None
