"""A content hash of the code that generates the evaluation pool, so the pool rebuilds by itself
when that code changes (no manual version number to bump).

`import_closure(package_dir, entries)` follows the imports of the entry files (parsed with `ast`,
never executed) through every module of the same package they reach, at any depth and inside
functions too (lazy imports count); `sources_hash` hashes the closure's paths and code (comments,
docstrings and layout left out, so documentation edits do not rebuild a pool). The
evaluation pool uses the closure of `composer_jax/env/tasks/*.py`: the generators, the mutation
and validation code, the sandbox and test runner they verify tasks with, the held-out module list;
the suite's cache directory adds the closure of the suite builder.
"""
from __future__ import annotations

import ast
import hashlib
import pathlib
from typing import Iterable


def _module_file(root: pathlib.Path, dotted: str) -> pathlib.Path | None:
    """`root`'s file of module `dotted` (its first part is the package name, `root`'s name)."""
    parts = dotted.split(".")
    if not parts or parts[0] != root.name:
        return None
    base = root.joinpath(*parts[1:])
    for cand in (base.with_suffix(".py") if len(parts) > 1 else None, base / "__init__.py"):
        if cand is not None and cand.is_file():
            return cand
    return None


def _dotted(root: pathlib.Path, path: pathlib.Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = [root.name, *rel.parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(root: pathlib.Path, path: pathlib.Path) -> set[str]:
    """Dotted names the file imports (absolute; relative imports resolved), with `from A import b`
    giving both A and A.b (b may be a submodule)."""
    tree = ast.parse(path.read_bytes(), filename=str(path))
    pkg = _dotted(root, path)
    if path.name != "__init__.py":
        pkg = pkg.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names if a.name != "*")
    return out


def import_closure(package_dir, entries: Iterable) -> list[pathlib.Path]:
    """Every file of the package at `package_dir` that the `entries` files import, directly or
    through each other, the entries and the parent packages' `__init__.py` included; sorted."""
    root = pathlib.Path(package_dir).resolve()
    todo = [pathlib.Path(e).resolve() for e in entries]
    seen: set[pathlib.Path] = set()
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        names = _imported(root, f)
        parts = _dotted(root, f).split(".")
        names.update(".".join(parts[:i]) for i in range(1, len(parts)))   # parent packages
        for name in names:
            target = _module_file(root, name)
            if target is not None and target.resolve() not in seen:
                todo.append(target.resolve())
    return sorted(seen)


def code_text(path) -> str:
    """The code of a Python file without its comments, docstrings and layout (`ast.dump` of the
    parsed module with every docstring removed): what a hash of behaviour should see."""
    tree = ast.parse(pathlib.Path(path).read_bytes(), filename=str(path))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            node.body = body[1:]
    return ast.dump(tree)


def sources_hash(package_dir, entries: Iterable) -> str:
    """SHA-256 (hex) over the package-relative path and code (`code_text`) of every file in the
    closure: a code change anywhere in it changes the hash, an edited comment or docstring does
    not."""
    root = pathlib.Path(package_dir).resolve()
    h = hashlib.sha256()
    for f in import_closure(root, entries):
        h.update(f.relative_to(root).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(code_text(f).encode()).digest())
    return h.hexdigest()


def task_generator_hash() -> str:
    """`sources_hash` of `composer_jax/env/tasks/*.py` and everything in composer_jax they use."""
    root = pathlib.Path(__file__).resolve().parents[1]
    return sources_hash(root, sorted((root / "env" / "tasks").glob("*.py")))


def suite_builder_hash() -> str:
    """`sources_hash` of the suite builder (`eval/suite.py` with its soundness check,
    `eval/prompts.py`, and what they use): part of the suite's cache directory name, so a changed
    selection, check or prompt rebuilds it."""
    root = pathlib.Path(__file__).resolve().parents[1]
    return sources_hash(root, [root / "eval" / "suite.py", root / "eval" / "prompts.py"])
