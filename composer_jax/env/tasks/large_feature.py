"""Large-feature tasks: a whole class, or a group of related functions, to re-implement.

A site is either every method of one top-level class or a run of 2-6 adjacent top-level functions
(or adjacent methods of one class) whose bodies add up to at least `min_lines` lines (at most
MAX_LINES). Each body (after its docstring) becomes `raise NotImplementedError`; signatures,
decorators and docstrings stay, so the request is well defined and the tests say whether the
re-implementation is right.
"""
from __future__ import annotations

import ast
import dataclasses

MAX_LINES = 400
MAX_GROUP = 6


@dataclasses.dataclass(frozen=True)
class Stub:
    qualname: str
    doc: str
    first: int   # first body line (after the docstring), 1-based
    last: int
    indent: int

    @property
    def lines(self) -> int:
        return self.last - self.first + 1


@dataclasses.dataclass(frozen=True)
class LargeSite:
    label: str            # "class TextWrapper" or "functions a, b and c"
    stubs: tuple          # of Stub, in file order
    class_name: str = ""

    @property
    def lines(self) -> int:
        return sum(s.lines for s in self.stubs)

    @property
    def qualnames(self) -> tuple[str, ...]:
        return tuple(s.qualname for s in self.stubs)


def _stub(fn, prefix: str) -> Stub | None:
    body = list(fn.body)
    doc = ast.get_docstring(fn)
    if doc is not None:
        body = body[1:]
    if not body or body[0].lineno <= fn.lineno:
        return None
    return Stub(prefix + fn.name, doc or "", body[0].lineno, fn.end_lineno, body[0].col_offset)


def _runs(stubs: list[Stub], min_lines: int):
    """Shortest runs of 2..MAX_GROUP adjacent stubs reaching `min_lines` (each start once)."""
    for i in range(len(stubs)):
        total = 0
        for j in range(i, min(len(stubs), i + MAX_GROUP)):
            total += stubs[j].lines
            if total > MAX_LINES:
                break
            if total >= min_lines and j > i:
                yield tuple(stubs[i:j + 1])
                break


def _label(names) -> str:
    names = [f"`{n}`" for n in names]
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]


def large_sites(text: str, min_lines: int) -> list[LargeSite]:
    """Every class and function-group site of a module (see the module docstring)."""
    tree = ast.parse(text)
    out = []
    top: list[Stub] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            s = _stub(node, "")
            if s is not None and not node.name.startswith("__"):
                top.append(s)
            elif s is None:
                top.append(Stub(node.name, "", 0, -1, 0))  # breaks adjacency
        elif isinstance(node, ast.ClassDef):
            top.append(Stub(node.name, "", 0, -1, 0))
            methods = [s for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
                       for s in [_stub(m, node.name + ".")] if s is not None]
            total = sum(s.lines for s in methods)
            if len(methods) >= 2 and min_lines <= total <= MAX_LINES:
                out.append(LargeSite(f"class `{node.name}`", tuple(methods), node.name))
            public = [s for s in methods if not s.qualname.split(".")[-1].startswith("__")
                      or s.qualname.endswith(".__init__")]
            if total > MAX_LINES or len(public) > MAX_GROUP:
                for run in _runs(public, min_lines):
                    out.append(LargeSite(f"the methods {_label([s.qualname for s in run])} of "
                                         f"class `{node.name}`", run, node.name))
    real = [s for s in top]
    for run in _runs(real, min_lines):
        if all(s.last >= s.first for s in run):
            out.append(LargeSite(f"the functions {_label([s.qualname for s in run])}", run))
    return out


def apply_stubs(text: str, site: LargeSite) -> str:
    """`text` with every body of `site` replaced by `raise NotImplementedError`."""
    lines = text.splitlines(True)
    for s in sorted(site.stubs, key=lambda s: -s.first):
        lines[s.first - 1:s.last] = [" " * s.indent + "raise NotImplementedError\n"]
    return "".join(lines)
