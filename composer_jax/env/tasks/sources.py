"""Which modules of an installed CPython can become tasks.

A source is a single-file stdlib module `X.py` with a single-file test `test/test_X.py`. Excluded:
private/underscore modules, modules the interpreter imports at start-up (they cannot be shadowed
by the workspace copy), oversized modules, and — by split —
the held-out modules (`composer_jax.heldout`): training tasks never use them, evaluation tasks only
use them.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
import subprocess

from composer_jax.env.config import Split
from composer_jax.env.pythons import PythonInstall
from composer_jax.heldout import is_heldout_path

NEVER = frozenset({"antigravity", "this", "__future__", "__phello__", "site", "sitecustomize"})


@dataclasses.dataclass(frozen=True)
class ModuleSource:
    """A module file and its test file in one CPython install."""
    version: str
    module: str
    module_path: str
    test_path: str

    @property
    def test_module(self) -> str:
        return "test_" + self.module


@functools.lru_cache(maxsize=None)
def preloaded_modules(executable: str) -> frozenset[str]:
    """Top-level modules the test runner cannot re-import from the workspace: those loaded at
    interpreter start-up and the runner's own (modules unittest pulls in later, such as difflib,
    are re-imported from the workspace by the runner)."""
    code = ("import sys, json\n"
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} | "
            "{'os', 'json', 'time', 'unittest', 'test'})))")
    out = subprocess.run([executable, "-S", "-c", code], capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin"})
    return frozenset(json.loads(out.stdout))


def discover(py: PythonInstall, split: Split, max_lines: int) -> list[ModuleSource]:
    """The candidate module sources of one install, sorted by name."""
    lib = pathlib.Path(py.stdlib)
    pre = preloaded_modules(py.executable)
    out = []
    for test in sorted((lib / "test").glob("test_*.py")):
        name = test.stem[len("test_"):]
        mod = lib / f"{name}.py"
        if not mod.is_file() or name.startswith("_") or name in NEVER or name in pre:
            continue
        if is_heldout_path(f"{name}.py") != (split == Split.EVAL):
            continue
        try:
            n = mod.read_text(encoding="utf-8").count("\n")
        except (UnicodeDecodeError, OSError):
            continue
        if n <= max_lines:
            out.append(ModuleSource(py.version, name, str(mod), str(test)))
    return out
