"""Run one child process with a wall-clock deadline and a cap on the output kept.

Output (stdout and stderr merged) is read as it comes; past `max_output_bytes` the rest is counted
but dropped, and past `kill_after_bytes` the child is killed (endless output must not cost the
whole timeout). On timeout the child's whole process group is killed with SIGKILL.
"""
from __future__ import annotations

import dataclasses
import os
import select
import signal
import subprocess
import time
from typing import Mapping, Sequence


@dataclasses.dataclass(frozen=True)
class ProcResult:
    """What a finished command produced.

    exit_code: the exit status (negative: killed by that signal); timed_out: killed at the deadline;
    output: the first `max_output_bytes` of merged stdout/stderr, decoded leniently;
    output_bytes: how many bytes were produced in total; truncated: output_bytes > len kept;
    killed_for_output: killed because it printed far too much; duration_s: wall time.
    """
    exit_code: int
    output: str
    timed_out: bool
    truncated: bool
    output_bytes: int
    killed_for_output: bool
    duration_s: float


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILLs the process group led by `proc` (started with start_new_session=True)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except ProcessLookupError:
        pass


def kill_pipe_writers(fd: int) -> int:
    """SIGKILLs every other process holding the pipe that `fd` (our read end) belongs to, found
    in /proc (Linux); returns how many."""
    try:
        pipe = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return 0
    me, killed = os.getpid(), 0
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            fds = os.listdir(f"/proc/{name}/fd")
            if any(os.readlink(f"/proc/{name}/fd/{f}") == pipe for f in fds):
                os.kill(int(name), signal.SIGKILL)
                killed += 1
        except (OSError, ValueError):      # gone meanwhile, or not ours to look at
            continue
    return killed


def close_process(proc: subprocess.Popen) -> None:
    """Kills a process group started with pipes, reaps the leader and closes its pipes."""
    kill_group(proc)
    proc.wait()
    for f in (proc.stdin, proc.stdout):
        try:
            if f is not None:
                f.close()
        except OSError:
            pass


def drain(fd: int, deadline: float, max_output_bytes: int, kill_after_bytes: int,
          stop_marker: bytes | None = None,
          leader: subprocess.Popen | None = None) -> tuple[bytes, int, str, bytes]:
    """Reads `fd` until EOF, the deadline, `kill_after_bytes`, or `stop_marker` appears.

    Returns (kept bytes, total bytes, why, marker line) with why in {"eof", "timeout", "overflow",
    "marker"}. The marker is looked for in a rolling window, so a long output cannot hide it; the
    kept bytes may contain the start of the marker line, which the caller strips. `leader`: a
    process nothing writing `fd` may outlive (a bubblewrap sandbox's outer process); when it has
    been gone for 0.1 s and `fd` is still open, every process still holding the pipe is killed
    (`kill_pipe_writers`: e.g. the sandbox's inner bwrap, orphaned by a SIGKILL of the outer one
    in the moment before bwrap arms --die-with-parent, which would run on or hang).
    """
    kept = bytearray()
    total = 0
    tail = b""
    gone, orphans_killed = None, False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return bytes(kept), total, "timeout", b""
        if leader is not None and not orphans_killed:
            if gone is None:
                gone = time.monotonic() if leader.poll() is not None else None
            elif time.monotonic() - gone > 0.1:
                orphans_killed = True
                kill_pipe_writers(fd)
        ready, _, _ = select.select([fd], [], [], min(left, 1.0 if leader is None else 0.05))
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return bytes(kept), total, "eof", b""
        total += len(chunk)
        if len(kept) < max_output_bytes:
            kept += chunk[: max_output_bytes - len(kept)]
        if stop_marker is not None:
            window = tail + chunk
            idx = window.find(stop_marker)
            if idx >= 0:
                end = window.find(b"\n", idx)
                rest = window[idx:] if end < 0 else window[idx:end + 1]
                while end < 0:  # read the rest of the marker line
                    more = os.read(fd, 4096)
                    if not more:
                        break
                    end = more.find(b"\n")
                    rest += more if end < 0 else more[:end + 1]
                return bytes(kept), total, "marker", rest
            tail = window[-(len(stop_marker) + 64):]
        if total > kill_after_bytes:
            return bytes(kept), total, "overflow", b""


def run_process(argv: Sequence[str], *, timeout_s: float, max_output_bytes: int,
                env: Mapping[str, str] | None = None, cwd: str | None = None,
                user: int | None = None, stdin_data: bytes | None = None,
                output_dies_with_leader: bool = False) -> ProcResult:
    """Runs argv to completion (or the deadline) in its own session; returns a ProcResult.
    `output_dies_with_leader`: nothing writing the output may outlive argv's process (a
    bubblewrap sandbox; `drain`'s `leader`)."""
    start = time.monotonic()
    kwargs = {}
    if user is not None:
        kwargs.update(user=user, group=user, extra_groups=[])
    proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE if stdin_data else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=dict(env or {}),
                            cwd=cwd, start_new_session=True, close_fds=True, **kwargs)
    try:
        if stdin_data:
            try:
                proc.stdin.write(stdin_data)
                proc.stdin.close()
            except BrokenPipeError:
                pass
        kept, total, why, _ = drain(proc.stdout.fileno(), start + timeout_s, max_output_bytes,
                                 kill_after_bytes=max(8 * max_output_bytes, 1 << 20),
                                 leader=proc if output_dies_with_leader else None)
        if why != "eof":
            kill_group(proc)
        else:
            # The leader closed its output; its group may linger (e.g. a daemon) - kill it too.
            try:
                proc.wait(timeout=max(0.0, start + timeout_s - time.monotonic()))
            except subprocess.TimeoutExpired:
                why = "timeout"
            kill_group(proc)
        code = proc.wait()
    finally:
        proc.stdout.close()
    return ProcResult(exit_code=code, output=kept.decode("utf-8", errors="replace"),
                      timed_out=why == "timeout", truncated=total > len(kept), output_bytes=total,
                      killed_for_output=why == "overflow", duration_s=time.monotonic() - start)
