"""Parent-side evaluation of a graded run, in its own process under a time and memory budget.

Everything the parent computes from what a graded process wrote (parsing its output, judging each
test, the reference summaries) runs in a fresh interpreter executing `verdict.py` as a script,
which caps its own address space (RLIMIT_AS) before reading the request; the parent kills it
past `timeout_s`. An overrun raises `EvaluationOverrun` (the episode fails with that reason; the
worker goes on).
"""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

from composer_jax.env import verdict

SCRIPT = pathlib.Path(verdict.__file__).resolve()
TIMEOUT_S = 30.0
MEMORY_BYTES = 2 << 30


class EvaluationOverrun(Exception):
    """The parent's evaluation of a graded run exceeded its time or memory budget."""


def evaluate_in_process(request: dict, timeout_s: float = TIMEOUT_S,
                        memory_bytes: int = MEMORY_BYTES) -> dict:
    """Runs `verdict._main` on `request` in a fresh `python -I -S` (module docstring)."""
    data = json.dumps(request)
    try:
        r = subprocess.run([sys.executable, "-I", "-S", str(SCRIPT), str(memory_bytes)],
                           input=data,
                           capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise EvaluationOverrun(f"evaluating the graded run took longer than {timeout_s:g}s") \
            from None
    if r.returncode != 0:
        why = "out of memory" if "MemoryError" in r.stderr else r.stderr.strip()[-300:]
        raise EvaluationOverrun(f"evaluating the graded run failed ({why}; limit "
                                f"{memory_bytes >> 20} MiB)")
    return json.loads(r.stdout)


def judge_output(output: str, nonce: str, references: dict, test_ids, **kw) -> dict:
    """`verdict.judge_run` under the budget."""
    return evaluate_in_process({"op": "judge", "output": output, "nonce": nonce,
                                "references": references, "test_ids": list(test_ids)}, **kw)


def summarise_outputs(first: str, second: str, nonce1: str, nonce2: str, test_ids, **kw) -> dict:
    """`verdict.summarise_runs` under the budget."""
    return evaluate_in_process({"op": "summary", "first": first, "second": second,
                                "nonce1": nonce1, "nonce2": nonce2,
                                "test_ids": list(test_ids)}, **kw)


def compare_outputs(output: str, nonce: str, expected: list, **kw) -> dict:
    """`verdict.compare_cases` under the budget."""
    return evaluate_in_process({"op": "cases", "output": output, "nonce": nonce,
                                "expected": expected}, **kw)
