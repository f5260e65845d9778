"""Held-back tests: FAIL_TO_PASS tests removed from the agent's copy of the test files.

`choose` picks about a third of a task's FAIL_TO_PASS tests (never all: at least one stays visible)
among those that can be removed alone - a method defined directly in the test's own class, which
no other class of the file inherits. `strip` deletes their definitions from the test files (the
snapshot the agent sees, and the installed copies hidden in its sandbox show that version); the
pool keeps the full files in `grading_tests/` and only the grader runs them. The problem statement
names only visible tests.
"""
from __future__ import annotations

import ast
import random

FRACTION = 1 / 3


def _split(test_id: str, modules: dict[str, str]) -> tuple[str, str, str] | None:
    """(test file, class, method) of an id "pkg.test_x.Class.test_m", given module -> file."""
    for mod, rel in sorted(modules.items(), key=lambda kv: -len(kv[0])):
        if test_id.startswith(mod + "."):
            rest = test_id[len(mod) + 1:].split(".")
            if len(rest) == 2:
                return rel, rest[0], rest[1]
    return None


def _removable(tree: ast.Module, cls: str, method: str) -> ast.FunctionDef | None:
    """The method's definition when it can be removed without touching another test."""
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    owner = next((c for c in classes if c.name == cls), None)
    if owner is None:
        return None
    if any(isinstance(b, ast.Name) and b.id == cls for c in classes for b in c.bases):
        return None  # a subclass would lose the test too
    defs = [n for n in owner.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.name == method]
    return defs[-1] if len(defs) == 1 else None


def choose(f2p, texts: dict[str, str], modules: dict[str, str], rng: random.Random) -> tuple:
    """The FAIL_TO_PASS ids to hold back (module docstring); `texts`: test file -> text,
    `modules`: test module name -> test file."""
    f2p = list(f2p)
    if len(f2p) < 2:
        return ()
    trees = {}
    ok = []
    for tid in f2p:
        where = _split(tid, modules)
        if where is None or where[0] not in texts:
            continue
        rel, cls, method = where
        try:
            tree = trees.setdefault(rel, ast.parse(texts[rel]))
        except SyntaxError:
            continue
        if _removable(tree, cls, method) is not None:
            ok.append(tid)
    n = min(len(ok), max(1, int(len(f2p) * FRACTION)), len(f2p) - 1)
    return tuple(sorted(rng.sample(ok, n))) if n > 0 else ()


def strip(texts: dict[str, str], held, modules: dict[str, str]) -> dict[str, str]:
    """`texts` with the held-back test methods deleted (a class left empty gets `pass`)."""
    by_file: dict[str, list[tuple[str, str]]] = {}
    for tid in held:
        rel, cls, method = _split(tid, modules)
        by_file.setdefault(rel, []).append((cls, method))
    out = dict(texts)
    for rel, pairs in by_file.items():
        tree = ast.parse(texts[rel])
        spans = []
        for cls, method in pairs:
            fn = _removable(tree, cls, method)
            owner = next(c for c in tree.body if isinstance(c, ast.ClassDef) and c.name == cls)
            gone = sum(1 for c, _ in pairs if c == cls)
            first = min([fn.lineno] + [d.lineno for d in fn.decorator_list])
            last_in_class = fn is owner.body[-1]
            fill = " " * fn.col_offset + "pass\n" if gone >= len(owner.body) and \
                last_in_class else ""
            spans.append((first, fn.end_lineno, fill))
        lines = texts[rel].splitlines(True)
        for first, last, fill in sorted(spans, reverse=True):
            lines[first - 1:last] = [fill] if fill else []
        out[rel] = "".join(lines)
        ast.parse(out[rel])  # still valid Python (raises otherwise: the task is not made)
    return out
