"""run_terminal_cmd and finish."""
from __future__ import annotations

from composer_jax.env.tools.result import ToolResult, error


def format_command_result(r) -> str:
    """Agent-facing text of a finished command: output, then a status line."""
    out = r.output.rstrip("\n")
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
