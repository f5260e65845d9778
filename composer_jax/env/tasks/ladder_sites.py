"""Mutation sites of the difficulty ladder's first two levels (pure: source text in, sites out).

Level 1, one broken token on a line the failing output names (fixed by one edit):
  name       a name read inside a function misspelt (`length` -> `lenght`): NameError, whose
             message carries CPython's own hint "Did you mean: 'length'?" (3.12+ tracebacks)
  attribute  an attribute of `self`/`cls` misspelt (`self.value` -> `self.valeu`): AttributeError
             with the hint "Did you mean: 'value'?" (3.12+)
  keyword    a keyword argument of a call misspelt (`f(key=1)` -> `f(kye=1)`): TypeError naming
             'kye' on the call's line (any version; `LadderKeywords.HINTED`: only where the message
             also carries CPython's hint "Did you mean 'key'?", 3.13+ and a callee written in Python,
             so the output names the fix as it does for names and attributes)
Level 2, one wrong operator/constant/boundary whose line the failing output does not name
(`mutate.py`'s binop_swap, boolop_swap, compare_flip, off_by_one, flip_constant); the level check
(`ladder_check.py`) rejects those whose traceback points at the line.

A site is a `mutate.Mutation` (so `mutate.apply` and the pool's records work unchanged) plus
what the failing output must show (`expect`, a regular expression) and the token it restores.
Only single-line expressions inside function bodies are used: the traceback's line is then the
mutated line on every CPython, and the module still imports.
"""
from __future__ import annotations

import ast
import builtins
import dataclasses
import keyword
import random
import re

from composer_jax.config.rl import LadderKeywords
from composer_jax.env.tasks import mutate

LEVEL1_KINDS = ("name", "attribute", "keyword")
LEVEL2_OPERATORS = ("binop_swap", "boolop_swap", "compare_flip", "off_by_one", "flip_constant")
HINT_MIN_VERSION = (3, 12)   # first CPython whose traceback module prints "Did you mean" hints
KEYWORD_HINT_MIN_VERSION = (3, 13)   # first CPython whose keyword-argument TypeError carries one
MIN_NAME = 4                 # shorter names have no one-edit typo CPython reliably suggests back


@dataclasses.dataclass(frozen=True)
class LadderSite:
    """One candidate edit: `mutation` breaks the module, `level` 1 or 2, `kind` (name, attribute,
    keyword or the level-2 operator), `original`/`typo` the token before/after (level 1), and
    `expect`: a regex the failing test's output must match (level 1; "" for level 2)."""
    mutation: mutate.Mutation
    level: int
    kind: str
    original: str = ""
    typo: str = ""
    expect: str = ""


def typos(name: str, rng: random.Random) -> list[str]:
    """One-edit misspellings of `name` (a dropped, doubled or swapped letter past the first), in
    random order; swaps only for names of 6+ letters (CPython's suggestion distance allows them)."""
    out = set()
    for i in range(1, len(name)):
        out.add(name[:i] + name[i + 1:])
        if name[i] != "_":
            out.add(name[:i] + name[i] + name[i:])
        if len(name) >= 6 and i + 1 < len(name) and name[i] != name[i + 1]:
            out.add(name[:i] + name[i + 1] + name[i] + name[i + 2:])
    good = sorted(t for t in out if t.isidentifier() and not keyword.iskeyword(t) and t != name
                  and not t.startswith("__") and not t.endswith("__"))
    rng.shuffle(good)
    return good


def identifiers(tree: ast.AST) -> frozenset[str]:
    """Every identifier of a module: names, attributes, arguments, keywords, defs, imports."""
    out = set(dir(builtins))
    for node in ast.walk(tree):
        for field in ("id", "attr", "arg", "name"):
            value = getattr(node, field, None)
            if isinstance(value, str):
                out.add(value)
        if isinstance(node, ast.alias):
            out.add((node.asname or node.name).split(".")[0])
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            out.update(node.names)
    return frozenset(out)


def _hint(kind: str, typo: str, original: str, keyword_hint: bool = False) -> str:
    t, o = re.escape(typo), re.escape(original)
    if kind == "name":
        return rf"NameError: name '{t}' is not defined\. Did you mean: '{o}'\?"
    if kind == "attribute":
        return rf"AttributeError: .*has no attribute '{t}'\. Did you mean: '{o}'\?"
    if keyword_hint:
        return rf"TypeError: .*unexpected keyword argument '{t}'\. Did you mean '{o}'\?"
    return rf"TypeError: .*'{t}'"


def _one_line(node: ast.AST) -> bool:
    return getattr(node, "lineno", None) is not None and node.lineno == node.end_lineno


def level1_sites(source: str, rng: random.Random, hints: bool = True,
                 keywords: str = "any") -> list[LadderSite]:
    """Level-1 sites of `source` in random order, one typo per site. `hints`: the target CPython
    prints "Did you mean" hints (3.12+); without them only keyword sites are made. `keywords`:
    "any" (keyword sites expect the TypeError naming the typo), "hinted" (they expect CPython
    3.13's hint too) or "none" (no keyword sites)."""
    tree = ast.parse(source)
    off = mutate._Offsets(source)
    taken = identifiers(tree)
    out = []

    def site(kind, node, start, end, original, qual):
        for typo in typos(original, rng):
            if typo not in taken:
                m = mutate.Mutation(f"{kind}_typo", start, end, typo, node.lineno, qual)
                out.append(LadderSite(m, 1, kind, original, typo,
                                      _hint(kind, typo, original, keywords == "hinted")))
                return

    for qual, fn in mutate._functions(tree):
        for node in (n for stmt in fn.body for n in ast.walk(stmt)):
            if not _one_line(node):
                continue
            if hints and isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) \
                    and len(node.id) >= MIN_NAME and not node.id.startswith("__"):
                a = off(node.lineno, node.col_offset)
                if source[a:a + len(node.id)] == node.id:
                    site("name", node, a, a + len(node.id), node.id, qual)
            elif hints and isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) \
                    and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls") \
                    and len(node.attr) >= MIN_NAME and not node.attr.startswith("__"):
                b = off(node.end_lineno, node.end_col_offset)
                if source[b - len(node.attr):b] == node.attr:
                    site("attribute", node, b - len(node.attr), b, node.attr, qual)
            elif isinstance(node, ast.Call) and keywords != "none":
                for kw in node.keywords:
                    if kw.arg is None or len(kw.arg) < MIN_NAME:
                        continue
                    a = off(kw.lineno, kw.col_offset)
                    if source[a:a + len(kw.arg)] == kw.arg:
                        site("keyword", node, a, a + len(kw.arg), kw.arg, qual)
    rng.shuffle(out)   # an identifier for an identifier: always parses, always a new AST
    return out


def level2_sites(source: str, rng: random.Random) -> list[LadderSite]:
    """Level-2 sites of `source` in random order: single-line operator/constant/boundary edits
    (not yet syntax-checked: `sites` checks them lazily, `mutate.is_valid` parses the module)."""
    out = [LadderSite(m, 2, m.operator) for m in mutate.enumerate_mutations(source)
           if m.operator in LEVEL2_OPERATORS and "\n" not in source[m.start:m.end]]
    rng.shuffle(out)
    return out


def supports_hints(python_version: str) -> bool:
    """True if `python_version`'s tracebacks carry "Did you mean" hints (level-1 name/attribute)."""
    return tuple(map(int, python_version.split("."))) >= HINT_MIN_VERSION


def level1_keywords(python_version: str, keywords: LadderKeywords) -> str:
    """`level1_sites`'s `keywords` for a task run by `python_version` under `keywords`."""
    if keywords is LadderKeywords.ANY:
        return "any"
    return "hinted" if tuple(map(int, python_version.split("."))) >= KEYWORD_HINT_MIN_VERSION else "none"


def raw_sites(source: str, level: int, python_version: str, rng: random.Random,
              keywords: LadderKeywords = LadderKeywords.ANY) -> list:
    """The level's sites of `source` for `python_version`, level-2 ones not yet syntax-checked."""
    if level == 1:
        return level1_sites(source, rng, hints=supports_hints(python_version),
                            keywords=level1_keywords(python_version, keywords))
    if level == 2:
        return level2_sites(source, rng)
    raise ValueError(f"ladder level must be 1 or 2, got {level}")


def sites(source: str, level: int, python_version: str, rng: random.Random,
          keywords: LadderKeywords = LadderKeywords.ANY):
    """Yields the level's valid sites of `source` for a task run by `python_version`, in random
    order (each level-2 site parsed when it is reached); `keywords`: which keyword sites."""
    for site in raw_sites(source, level, python_version, rng, keywords):
        if level == 1 or mutate.is_valid(source, [site.mutation]):
            yield site
