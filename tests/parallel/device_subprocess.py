"""Running the fake-device test scripts in a fresh interpreter.

XLA reads `--xla_force_host_platform_device_count` only when JAX starts, so each multi-device test
runs its cases in a subprocess that sets the flag first and prints one `RESULT {json}` line per
case.
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def subprocess_env() -> dict:
    """This process's environment with the repository importable and no inherited device count (the
    script appends its own to XLA_FLAGS)."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                                if not f.startswith("--xla_force_host_platform_device_count"))
    return env


def parse_results(stdout: str) -> list[dict]:
    """The JSON objects of the `RESULT ` lines of `stdout`, in order."""
    return [json.loads(line[len("RESULT "):]) for line in stdout.splitlines()
            if line.startswith("RESULT ")]


def run_script(script: str, cases, prefix=(), timeout: int = 900,
               cwd: str | None = None) -> list[dict]:
    """Runs `python script *prefix *cases`; asserts it exited cleanly with one result per case
    (else shows the end of its stderr) and returns the results in order."""
    cases = [str(c) for c in cases]
    proc = subprocess.run([sys.executable, script, *map(str, prefix), *cases],
                          capture_output=True, text=True, env=subprocess_env(), timeout=timeout,
                          cwd=cwd)
    results = parse_results(proc.stdout)
    assert proc.returncode == 0 and len(results) == len(cases), proc.stderr[-4000:]
    return results
