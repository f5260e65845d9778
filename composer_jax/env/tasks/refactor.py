"""Refactoring tasks: a public function, class or method renamed; callers and tests use the new API.

The agent gets the module as it is and the tests already updated to the new name (plus one test
class checking the API: the new name exists, the old one is gone); the reference renames the
definition and every use inside the module (and `__all__`). Behaviour is preserved, so the tests
that do not touch the renamed API pass before and after (PASS_TO_PASS) and the ones that do fail
before (FAIL_TO_PASS). Renaming is token-exact (`tokenize`), never textual.

A site is kept only if the rename is unambiguous: the name is defined once in the module, is not a
builtin or keyword, is used by the tests, and is not defined by the tests themselves; for a top-level
function or class the module must not also use it as an attribute of something else
(`obj.name`), and for a method the module must not use it as a bare name. A name that code the agent
cannot edit reaches (`external_uses`: the interpreter's own modules, a package's other modules) is
never renamed: the rename would break them (3.12's `traceback` calls `textwrap.indent`, so renaming
it leaves the grader's interpreter unable to format an error).
"""
from __future__ import annotations

import ast
import builtins
import dataclasses
import functools
import io
import keyword
import os
import random
import re
import tokenize

API_TEST_CLASS = "RenamedAPITest"
MIN_NAME = 4


@dataclasses.dataclass(frozen=True)
class RenameSite:
    """`old` -> `new`; `owner` is the class for a method ("" for a top-level name)."""
    old: str
    new: str
    owner: str
    kind: str  # "function" | "class" | "method"

    @property
    def qualname(self) -> str:
        return f"{self.owner}.{self.old}" if self.owner else self.old

    @property
    def new_qualname(self) -> str:
        return f"{self.owner}.{self.new}" if self.owner else self.new


def _tokens(text: str):
    return list(tokenize.generate_tokens(io.StringIO(text).readline))


def _offsets(text: str) -> list[int]:
    starts, pos = [0], 0
    for line in text.splitlines(True):
        pos += len(line)
        starts.append(pos)
    return starts


def rename_tokens(text: str, old: str, new: str) -> tuple[str, int]:
    """`text` with every NAME token `old`, and every string literal that is exactly `old`, renamed
    to `new`; returns (new text, number of replacements)."""
    starts = _offsets(text)
    spans = []
    for tok in _tokens(text):
        if tok.type == tokenize.NAME and tok.string == old:
            spans.append((starts[tok.start[0] - 1] + tok.start[1],
                          starts[tok.end[0] - 1] + tok.end[1], new))
        elif tok.type == tokenize.STRING and tok.string in (f"'{old}'", f'"{old}"'):
            q = tok.string[0]
            spans.append((starts[tok.start[0] - 1] + tok.start[1],
                          starts[tok.end[0] - 1] + tok.end[1], f"{q}{new}{q}"))
    for a, b, rep in reversed(spans):
        text = text[:a] + rep + text[b:]
    return text, len(spans)


def _name_uses(text: str, name: str) -> tuple[int, int]:
    """(bare uses, attribute uses `.name`) of NAME token `name`."""
    bare = attr = 0
    prev = None
    for tok in _tokens(text):
        if tok.type == tokenize.NAME and tok.string == name:
            if prev is not None and prev.type == tokenize.OP and prev.string == ".":
                attr += 1
            else:
                bare += 1
        if tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT):
            prev = tok
    return bare, attr


def _defined_names(tree: ast.AST) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
    return out


def _new_name(old: str, kind: str, module: str, rng: random.Random) -> str:
    stem = module.rsplit(".", 1)[-1].strip("_") or "mod"
    if kind == "class":
        return rng.choice(("Base", "Core", "Std")) + old
    prefix = rng.choice(("do_", "compute_", "run_", stem + "_"))
    return prefix + old.lstrip("_") if not old.startswith(prefix) else old + "_impl"


_SKIP_DIRS = frozenset({"tests", "site-packages", "dist-packages", "__pycache__"})


@dataclasses.dataclass(frozen=True)
class ExternalUses:
    """What code outside the task's edit files reaches of a module: `names` (top-level names, via
    `module.name`, `alias.name` or `from module import name`) and `attributes` (every `.attr` read
    in the files that use the module: a method may be called on an instance)."""
    names: frozenset = frozenset()
    attributes: frozenset = frozenset()


@functools.lru_cache(maxsize=256)
def external_uses(module: str, roots: tuple[str, ...], exclude: frozenset = frozenset()
                  ) -> ExternalUses:
    """The names of `module` that other Python files under `roots` reach (`ExternalUses`), so
    renaming them would break code the agent cannot edit. Aliases come from `import <module> as
    alias`. Test directories, site-packages and the paths in `exclude` are skipped (`test/support`
    is kept: the test harness imports it). Conservative: it may exclude more than needed."""
    last = module.rsplit(".", 1)[-1]
    alias_re = re.compile(rf"\bimport\s+(?:[\w.]*\.)?{last}\s+as\s+(\w+)")
    from_re = re.compile(rf"\bfrom\s+(?:[\w.]*\.)?{last}\s+import\s+(\([^)]*\)|[^\n]*)")
    attr_re = re.compile(r"\.\s*([A-Za-z_]\w*)")
    names: set[str] = set()
    attributes: set[str] = set()
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            if os.path.basename(dirpath) == "test" and dirpath != root:
                dirnames[:] = [d for d in dirnames if d == "support"]   # only test/support
                continue
            dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
            for f in filenames:
                path = os.path.join(dirpath, f)
                if not f.endswith(".py") or path in exclude:
                    continue
                try:
                    with open(path, encoding="utf-8", errors="replace") as fh:
                        src = fh.read()
                except OSError:
                    continue
                if last not in src:
                    continue
                used = False
                for n in [last] + alias_re.findall(src):
                    hits = re.findall(rf"(?<![\w.]){re.escape(n)}\.([A-Za-z_]\w*)", src)
                    names.update(hits)
                    used = used or bool(hits)
                for group in from_re.findall(src):
                    names.update(w for w in re.findall(r"[A-Za-z_]\w*", group) if w != "as")
                    used = True
                if used:
                    attributes.update(attr_re.findall(src))
    return ExternalUses(frozenset(names), frozenset(attributes))


def rename_sites(text: str, test_texts: dict[str, str], module: str,
                 rng: random.Random, external: ExternalUses = ExternalUses()) -> list[RenameSite]:
    """The unambiguous rename sites of a module (see the module docstring), in random order.
    `external`: what other code reaches (`external_uses`); it is never renamed."""
    tree = ast.parse(text)
    defs: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defs[node.name] = defs.get(node.name, 0) + 1
    test_trees = {}
    for rel, t in test_texts.items():
        try:
            test_trees[rel] = ast.parse(t)
        except SyntaxError:
            continue
    test_defined = set().union(*(_defined_names(t) for t in test_trees.values())) if test_trees else set()
    taken = set(defs) | set(dir(builtins)) | test_defined
    out = []

    def ok(name):
        return (len(name) >= MIN_NAME and not name.startswith("_") and defs.get(name) == 1
                and not keyword.iskeyword(name) and name not in dir(builtins)
                and name not in test_defined and name not in external.names
                and any(_name_uses(t, name) != (0, 0) for t in test_texts.values()))

    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and ok(node.name):
            if _name_uses(text, node.name)[1] == 0:
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                new = _new_name(node.name, kind, module, rng)
                if new not in taken:
                    out.append(RenameSite(node.name, new, "", kind))
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for m in node.body:
                if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and ok(m.name) \
                        and _name_uses(text, m.name)[0] == 1 and m.name not in external.attributes:
                    new = _new_name(m.name, "method", module, rng)
                    if new not in taken:
                        out.append(RenameSite(m.name, new, node.name, "method"))
    rng.shuffle(out)
    return out


def api_test(module: str, site: RenameSite) -> str:
    """A test class (appended to the updated test file) checking the renamed API."""
    target = f"mod.{site.owner}" if site.owner else "mod"
    return (f"\n\nclass {API_TEST_CLASS}(__import__('unittest').TestCase):\n"
            f"    def test_new_name_exists(self):\n"
            f"        mod = __import__('importlib').import_module({module!r})\n"
            f"        self.assertTrue(hasattr({target}, {site.new!r}))\n\n"
            f"    def test_old_name_removed(self):\n"
            f"        mod = __import__('importlib').import_module({module!r})\n"
            f"        self.assertFalse(hasattr({target}, {site.old!r}))\n")


def apply_rename(module_text: str, test_texts: dict[str, str], module: str,
                 site: RenameSite) -> tuple[str, dict[str, str], str] | None:
    """(renamed module, updated test files, the test file holding the API test) or None when the
    rename does not parse or does not touch the tests."""
    new_module, n = rename_tokens(module_text, site.old, site.new)
    if n < 1:
        return None
    tests, api_file = {}, ""
    for rel, text in sorted(test_texts.items()):
        new_text, k = rename_tokens(text, site.old, site.new)
        if k and not api_file:
            api_file = rel
            new_text += api_test(module, site)
        tests[rel] = new_text
    if not api_file:
        return None
    try:
        ast.parse(new_module)
        for t in tests.values():
            ast.parse(t)
    except SyntaxError:
        return None
    return new_module, tests, api_file
