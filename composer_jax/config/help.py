"""The help text of every config key, read from the config classes' source: a field's trailing
comment (and the comment lines indented under it), else the comment block just above it, else the
clause of the class docstring that names it (`name: ...;` or `` `name` ... ``).

Used for the `--config.KEY` flags' help (`launch.py --helpfull`) and `describe_config`. Standard
library only (config/ sits below everything).
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import re
import textwrap
import tokenize

MAX_CHARS = 240


def _comments_by_line(source: str) -> dict[int, tuple[str, bool]]:
    """{line number: (comment text, whether the line holds only the comment)}."""
    out = {}
    lines = source.splitlines()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            own_line = not lines[row - 1][:col].strip()
            out[row] = (tok.string.lstrip("#").strip(), own_line)
    return out


def _from_source(cls) -> dict[str, str]:
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    comments = _comments_by_line(source)
    body = ast.parse(source).body[0].body
    fields = [n for n in body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    out = {}
    for i, node in enumerate(fields):
        parts = []
        if node.end_lineno in comments and not comments[node.end_lineno][1]:
            parts.append(comments[node.end_lineno][0])
            nxt = fields[i + 1].lineno if i + 1 < len(fields) else 10 ** 9
            row = node.end_lineno + 1       # comment lines continuing the trailing comment
            while row < nxt and row in comments and comments[row][1]:
                parts.append(comments[row][0])
                row += 1
        else:
            row = node.lineno - 1           # the comment block right above the field
            above = []
            while row in comments and comments[row][1]:
                above.insert(0, comments[row][0])
                row -= 1
            parts = [p for p in above if not p.startswith("---")]
        text = " ".join(p for p in parts if p)
        if text:
            out[node.target.id] = text
    return out


def _from_docstring(cls, name: str) -> str:
    doc = " ".join((cls.__doc__ or "").split())
    m = re.search(rf"(?<![\w.]){name}`?(?=[\s:(=,;])", doc) or re.search(rf"`{name}`", doc)
    if not m:
        return ""
    start = doc.rfind("`", 0, m.start() + 1) if doc[m.start() - 1:m.start()] == "`" else m.start()
    rest = doc[max(start, 0):]
    end = re.search(r";|\.\s|\.$", rest)
    return rest[:end.start() if end else len(rest)].strip()


@functools.cache
def field_help(cls) -> dict[str, str]:
    """{field name: help text} of a config dataclass (its bases' fields included); "" when the
    source says nothing about a field."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            out.update(_from_source(klass))
    for f in dataclasses.fields(cls):
        if not out.get(f.name):
            out[f.name] = _from_docstring(cls, f.name)
    return {k: (v if len(v) <= MAX_CHARS else v[:MAX_CHARS - 3] + "...") for k, v in out.items()}
