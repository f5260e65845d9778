"""The machine's load line for benchmark results files (`uptime`), shared by the benchmark scripts."""
import subprocess


def uptime() -> str:
    """`uptime`'s one line (time, up, load averages), or a note when it cannot run."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "uptime unavailable"
