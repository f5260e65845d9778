"""Bug injection by AST mutation, applied as minimal text edits so diffs stay small and real.

Operators (each a `Mutation`: a span of the original source and its replacement):
  binop_swap       a + b -> a - b, * <-> /, // -> /, & <-> |, << <-> >>, % -> //
  compare_flip     < <-> <=, > <-> >=, == <-> !=, in <-> not in, is <-> is not
  boolop_swap      and <-> or
  off_by_one       an integer literal n -> n + 1 or n - 1 (in arithmetic, comparisons, slices, calls)
  negate_condition if/while/elif test -> not (test)
  remove_statement an assignment, call or return line deleted (or replaced by `pass`)
  flip_constant    True <-> False
  swap_arguments   f(a, b, ...) -> f(b, a, ...)
Only code inside functions is mutated (module-level edits tend to break every test at import).
"""
from __future__ import annotations

import ast
import dataclasses
import re

OPERATORS = ("binop_swap", "compare_flip", "boolop_swap", "off_by_one", "negate_condition",
             "remove_statement", "flip_constant", "swap_arguments")

_BINOP = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "/"), ast.Div: ("/", "*"),
          ast.FloorDiv: ("//", "/"), ast.BitAnd: ("&", "|"), ast.BitOr: ("|", "&"),
          ast.LShift: ("<<", ">>"), ast.RShift: (">>", "<<"), ast.Mod: ("%", "//")}
_CMP = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
        ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="), ast.In: ("in", "not in"),
        ast.NotIn: ("not in", "in"), ast.Is: ("is", "is not"), ast.IsNot: ("is not", "is")}


@dataclasses.dataclass(frozen=True)
class Mutation:
    """Replace source[start:end] (character offsets) with `replacement`."""
    operator: str
    start: int
    end: int
    replacement: str
    line: int
    function: str

    @property
    def key(self) -> str:
        return f"{self.operator}@{self.start}-{self.end}:{self.replacement}"

    def describe(self) -> str:
        return f"{self.operator} in {self.function} (line {self.line})"


class _Offsets:
    """(line, col) -> character offset; ast col offsets are UTF-8 byte offsets."""

    def __init__(self, source: str):
        self.lines = source.splitlines(True)
        self.starts = [0]
        for ln in self.lines:
            self.starts.append(self.starts[-1] + len(ln))

    def __call__(self, lineno: int, col: int) -> int:
        line = self.lines[lineno - 1]
        return self.starts[lineno - 1] + len(line.encode("utf-8")[:col].decode("utf-8", "replace"))


def _functions(tree: ast.AST):
    """(qualname, function node) for every function/method not nested in another function."""
    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield prefix + child.name, child
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, prefix + child.name + ".")
    yield from walk(tree, "")


def _op_span(src: str, off: _Offsets, left: ast.AST, right: ast.AST, token: str):
    """Character span of operator `token` between two nodes, or None if not cleanly found."""
    a = off(left.end_lineno, left.end_col_offset)
    b = off(right.lineno, right.col_offset)
    middle = src[a:b]
    pattern = r"\s+".join(map(re.escape, token.split())) if token[0].isalpha() else re.escape(token)
    if token[0].isalpha():
        pattern = r"(?<![\w])" + pattern + r"(?![\w])"
    matches = [m for m in re.finditer(pattern, middle)]
    if len(matches) != 1 or "#" in middle:
        return None
    m = matches[0]
    if token in ("/", "*", "<", ">", "&", "|") and (middle[m.end():m.end() + 1] in ("/", "*", "=", "<", ">")
                                                   or middle[m.start() - 1:m.start()] in ("/", "*", "<", ">", "!", "=")):
        return None
    return a + m.start(), a + m.end()


def _sites(src: str, qual: str, fn: ast.AST, off: _Offsets):
    parents = {}
    for node in ast.walk(fn):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    body_nodes = [n for stmt in fn.body for n in ast.walk(stmt)]
    doc = fn.body[0] if (fn.body and isinstance(fn.body[0], ast.Expr)
                         and isinstance(fn.body[0].value, ast.Constant)
                         and isinstance(fn.body[0].value.value, str)) else None
    for node in body_nodes:
        line = getattr(node, "lineno", fn.lineno)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOP:
            tok, new = _BINOP[type(node.op)]
            span = _op_span(src, off, node.left, node.right, tok)
            if span:
                yield Mutation("binop_swap", *span, new, line, qual)
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMP:
            tok, new = _CMP[type(node.ops[0])]
            span = _op_span(src, off, node.left, node.comparators[0], tok)
            if span:
                yield Mutation("compare_flip", *span, new, line, qual)
        elif isinstance(node, ast.BoolOp) and len(node.values) == 2:
            tok, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
            span = _op_span(src, off, node.values[0], node.values[1], tok)
            if span:
                yield Mutation("boolop_swap", *span, new, line, qual)
        elif (isinstance(node, ast.Constant) and type(node.value) is int and node.value < 10 ** 6
              and isinstance(parents.get(node), (ast.BinOp, ast.Compare, ast.Slice, ast.Subscript,
                                                 ast.Call, ast.UnaryOp))):
            a, b = off(node.lineno, node.col_offset), off(node.end_lineno, node.end_col_offset)
            if src[a:b] == str(node.value):
                new = node.value + 1 if node.value in (0, 1) or (a + node.value) % 2 else node.value - 1
                yield Mutation("off_by_one", a, b, str(new), line, qual)
        elif isinstance(node, ast.Constant) and type(node.value) is bool:
            a, b = off(node.lineno, node.col_offset), off(node.end_lineno, node.end_col_offset)
            yield Mutation("flip_constant", a, b, str(not node.value), line, qual)
        elif isinstance(node, (ast.If, ast.While)) and node.test.lineno == node.test.end_lineno:
            a, b = off(node.test.lineno, node.test.col_offset), off(node.test.end_lineno,
                                                                   node.test.end_col_offset)
            if "#" not in src[a:b]:
                yield Mutation("negate_condition", a, b, f"not ({src[a:b]})", line, qual)
        elif (isinstance(node, ast.Call) and len(node.args) >= 2 and not node.keywords
              and not any(isinstance(x, ast.Starred) for x in node.args[:2])
              and node.args[0].lineno == node.args[1].end_lineno):
            x, y = node.args[0], node.args[1]
            a, b = off(x.lineno, x.col_offset), off(y.end_lineno, y.end_col_offset)
            ta = src[a:off(x.end_lineno, x.end_col_offset)]
            tb = src[off(y.lineno, y.col_offset):b]
            mid = src[off(x.end_lineno, x.end_col_offset):off(y.lineno, y.col_offset)]
            if ta != tb and mid.strip() == "," and "(" not in ta + tb:
                yield Mutation("swap_arguments", a, b, tb + mid + ta, line, qual)
    for block in _blocks(fn):
        removable = [s for s in block if s is not doc and isinstance(s, (ast.Assign, ast.AugAssign,
                                                                          ast.Expr, ast.Return))
                     and not (isinstance(s, ast.Expr) and not isinstance(s.value, ast.Call))]
        for s in removable:
            a = off(s.lineno, 0)
            b = off(s.end_lineno, 0) + len(off.lines[s.end_lineno - 1])
            text = src[a:b]
            if text[:s.col_offset].strip() or ";" in text or not text.endswith("\n"):
                continue
            keep = len(block) - (1 if doc in block else 0) >= 2
            repl = "" if keep else " " * s.col_offset + "pass\n"
            yield Mutation("remove_statement", a, b, repl, s.lineno, qual)


def _blocks(fn: ast.AST):
    for node in ast.walk(fn):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block


def apply(source: str, mutations) -> str:
    """Applies non-overlapping mutations (any order) to `source`."""
    out = source
    for m in sorted(mutations, key=lambda m: m.start, reverse=True):
        out = out[:m.start] + m.replacement + out[m.end:]
    return out


def enumerate_mutations(source: str) -> list[Mutation]:
    """Every mutation site of `source`, in source order (not yet syntax-checked: see `is_valid`)."""
    tree = ast.parse(source)
    off = _Offsets(source)
    out = {}
    for qual, fn in _functions(tree):
        for m in _sites(source, qual, fn, off):
            out.setdefault(m.key, m)
    return sorted(out.values(), key=lambda m: (m.start, m.operator))


def is_valid(source: str, mutations) -> bool:
    """True if the mutated source parses and its AST differs from the original's."""
    try:
        new = ast.parse(apply(source, mutations))
    except (SyntaxError, ValueError):
        return False
    return ast.dump(new) != ast.dump(ast.parse(source))


def overlaps(a: Mutation, b: Mutation) -> bool:
    return a.start < b.end and b.start < a.end
