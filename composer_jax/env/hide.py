"""Hiding every copy of a task's reference files inside its sandbox.

Bug, feature, multi-bug and large-feature tasks use an installed module (stdlib or site-packages)
as the reference solution, and a migration's reference is the newer interpreter's copy: anything
mounted in the sandbox (the system's /usr with its own CPython and dist-packages, the task's CPython
prefix, extra binds) may hold it. `overlays(...)` finds, under every mounted root, each file whose
path ends with an edit file's workspace path ("textwrap.py", "simplejson/decoder.py") - every
interpreter's stdlib, site-packages and dist-packages, vendored copies under the same relative path -
and its bytecode (`__pycache__/<stem>.*.pyc`, legacy `<stem>.pyc`). Each gets a read-only bind of a
replacement: the snapshot's own version of the file for sources (so the interpreter still imports a
working module and nothing new is revealed), an empty file for bytecode (CPython then compiles
the source instead). The walk of each root is done once per process (a few seconds for /usr).

Only the bubblewrap backend can overlay files; the fallback sandbox cannot hide anything (it already
warns that it does not isolate the filesystem).
"""
from __future__ import annotations

import functools
import os
import pathlib

SKIP_DIRS = frozenset({"/proc", "/sys", "/dev", "/tmp", "/run", "/var", "/home", "/root"})


@functools.lru_cache(maxsize=None)
def _index(root: str) -> tuple[dict, dict]:
    """(basename -> paths of the regular .py files, stem -> paths of the .pyc/.pyo files) under
    `root` (symlinks not followed; "x.cpython-312.pyc" has stem "x")."""
    sources: dict[str, list[str]] = {}
    bytecode: dict[str, list[str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if os.path.join(dirpath, d) not in SKIP_DIRS]
        for f in filenames:
            if f.endswith((".py", ".pyc", ".pyo")):
                p = os.path.join(dirpath, f)
                if os.path.islink(p):
                    continue
                if f.endswith(".py"):
                    sources.setdefault(f, []).append(p)
                else:
                    bytecode.setdefault(f.split(".", 1)[0], []).append(p)
    return ({k: tuple(v) for k, v in sources.items()},
            {k: tuple(v) for k, v in bytecode.items()})


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


@functools.lru_cache(maxsize=4096)
def copies(rel: str, roots: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(source copies, bytecode copies) of workspace file `rel` under the mounted `roots`."""
    rel = rel.strip("/")
    base = rel.rsplit("/", 1)[-1]
    stem = base[:-3] if base.endswith(".py") else base
    sources, bytecode = set(), set()
    for root in roots:
        src_idx, pyc_idx = _index(root)
        for p in src_idx.get(base, ()):
            if p.endswith("/" + rel):
                sources.add(p)
        for p in pyc_idx.get(stem, ()):
            d = os.path.dirname(p)
            if os.path.basename(d) == "__pycache__":
                owner = os.path.join(os.path.dirname(d), base)
            else:  # legacy x.pyc next to x.py
                owner = p[:-1]
            if owner.endswith("/" + rel):
                bytecode.add(p)
    return tuple(sorted(sources)), tuple(sorted(bytecode))


def mounted_roots(python_prefixes, extra_ro_binds) -> tuple[str, ...]:
    """The read-only trees a bubblewrap sandbox mounts (see `sandbox._system_binds`)."""
    roots = ["/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        p = pathlib.Path("/" + name)
        if p.is_dir() and not p.is_symlink():
            roots.append(str(p))
    roots += [str(x) for x in python_prefixes] + [str(x) for x in extra_ro_binds]
    out = []
    for r in roots:
        if os.path.isdir(r) and not any(_under(r, o) for o in out):
            out = [o for o in out if not _under(o, r)] + [r]
    return tuple(out)


def overlays(edit_files: dict[str, str], roots, scratch: pathlib.Path) -> tuple[tuple[str, str], ...]:
    """(host replacement, sandbox path) binds hiding every copy of `edit_files` (rel -> the
    snapshot's text of it) under `roots`; replacement files are written into `scratch`."""
    scratch.mkdir(parents=True, exist_ok=True)
    os.chmod(scratch, 0o755)
    empty = scratch / "empty"
    empty.write_bytes(b"")
    os.chmod(empty, 0o644)
    out = []
    for i, (rel, text) in enumerate(sorted(edit_files.items())):
        sources, bytecode = copies(rel, tuple(roots))
        if sources:
            repl = scratch / f"{i}_{rel.rsplit('/', 1)[-1]}"
            repl.write_text(text, encoding="utf-8")
            os.chmod(repl, 0o644)
            out += [(str(repl), p) for p in sources]
        out += [(str(empty), p) for p in bytecode]
    return tuple(out)
