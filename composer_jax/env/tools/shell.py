"""run_terminal_cmd and finish."""
from __future__ import annotations

import re

from composer_jax.env.tools.result import ToolResult, error

# test runners' wall-clock durations: unittest "Ran 3 tests in 0.012s", pytest "... passed in 0.12s ..."
_UNITTEST_TIME = re.compile(r"^(Ran \d+ tests?) in \d+(?:\.\d+)?s$", re.MULTILINE)
_PYTEST_TIME = re.compile(r"^(=+ .*\b(?:passed|failed|error|errors|skipped|deselected|no tests ran)\b.*) "
                          r"in \d+(?:\.\d+)?s(?: \([0-9:]+\))?( =+)$", re.MULTILINE)


def without_durations(text: str) -> str:
    """`text` with the test runners' wall-clock durations replaced by 0 ("Ran 3 tests in 0.000s",
    "=== 1 failed in 0.00s ==="): the part of a command's output seen to differ between two
    runs of the same episode, so the same seed feeds the policy the same tokens."""
    text = _UNITTEST_TIME.sub(r"\1 in 0.000s", text)
    return _PYTEST_TIME.sub(r"\1 in 0.00s\2", text)


def format_command_result(r) -> str:
    """Agent-facing text of a finished command: output (test-runner durations zeroed:
    `without_durations`), then a status line."""
    out = without_durations(r.output).rstrip("\n")
    notes = []
    if r.truncated:
        notes.append(f"output truncated: showed {len(r.output.encode())} of {r.output_bytes} bytes")
    if r.killed_for_output:
        notes.append("killed: too much output")
    if r.timed_out:
        notes.append(f"timed out after {r.duration_s:.1f}s; every process was killed")
    status = f"[exit code {r.exit_code}" + ("; " + "; ".join(notes) if notes else "") + "]"
    return (out + "\n" if out else "") + status


def run_terminal_cmd(ws, args: dict) -> ToolResult:
    command = args["command"]
    if not command.strip():
        return error("command is empty")
    if args.get("is_background", False):
        job = ws.sandbox.spawn(command)
        return ToolResult(f"Started background job {job}; its output is discarded and it is "
                          f"killed when the episode ends.")
    cap = ws.config.command_timeout_s
    timeout = args.get("timeout", cap)
    if timeout <= 0:
        return error(f"timeout must be a positive number of seconds (at most {cap:g})")
    r = ws.run_command(command, timeout_s=min(float(timeout), cap))
    return ToolResult(format_command_result(r), is_error=False)


def finish(ws, args: dict) -> ToolResult:
    return ToolResult(args["message"], finished=True)
