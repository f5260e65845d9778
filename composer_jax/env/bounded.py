"""Parent-side evaluation of a graded run, in its own process under a time and memory budget.

Everything the parent computes from what a graded process wrote (parsing its output, judging each
test, comparing secret-case outputs, the reference summaries) runs in an evaluator process: a
`python -I -S verdict.py` that caps its own address space (RLIMIT_AS) before reading anything and
answers one JSON request per line. Each grading thread keeps one evaluator (starting a Python per
request cost ~40 ms, a third of a grading); a request that exceeds `timeout_s` gets the process
killed, one that runs out of memory ends it, and either raises `EvaluationOverrun` (the episode
fails with that reason; the worker goes on, with a fresh evaluator next time).
"""
from __future__ import annotations

import json
import os
import pathlib
import selectors
import subprocess
import sys
import threading
import time

from composer_jax.env import verdict

SCRIPT = pathlib.Path(verdict.__file__).resolve()
TIMEOUT_S = 30.0
MEMORY_BYTES = 2 << 30


class EvaluationOverrun(Exception):
    """The parent's evaluation of a graded run exceeded its time or memory budget."""


class Evaluator:
    """One evaluator process (module docstring); not thread-safe: one per thread."""

    def __init__(self, memory_bytes: int):
        self.memory_bytes = memory_bytes
        self.proc = subprocess.Popen([sys.executable, "-I", "-S", str(SCRIPT), str(memory_bytes)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.alive():
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            f.close()

    def ask(self, request: dict, timeout_s: float) -> dict:
        """The answer to `request`, or EvaluationOverrun (the process is then closed)."""
        deadline = time.monotonic() + timeout_s
        try:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
            line = self._read_line(deadline, timeout_s)
        except (BrokenPipeError, OSError):
            self.close()
            raise EvaluationOverrun("the evaluator died (out of memory?)") from None
        out = json.loads(line)
        if "error" in out:
            self.close()
            raise EvaluationOverrun(f"evaluating the graded run failed ({out['error']}; limit "
                                    f"{self.memory_bytes >> 20} MiB)")
        return out

    def _read_line(self, deadline: float, timeout_s: float) -> bytes:
        fd = self.proc.stdout.fileno()
        chunks = []
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    self.close()
                    raise EvaluationOverrun(f"evaluating the graded run took longer than "
                                            f"{timeout_s:g}s")
                data = os.read(fd, 1 << 20)
                if not data:
                    self.close()
                    raise EvaluationOverrun("the evaluator died (out of memory?)")
                chunks.append(data)
                if data.endswith(b"\n"):
                    return b"".join(chunks)


_LOCAL = threading.local()


def evaluate_in_process(request: dict, timeout_s: float = TIMEOUT_S,
                        memory_bytes: int = MEMORY_BYTES) -> dict:
    """`verdict.answer(request)` in this thread's evaluator process (module docstring)."""
    ev = getattr(_LOCAL, "evaluator", None)
    if ev is None or not ev.alive() or ev.memory_bytes != memory_bytes:
        if ev is not None:
            ev.close()
        ev = _LOCAL.evaluator = Evaluator(memory_bytes)
    return ev.ask(request, timeout_s)


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
