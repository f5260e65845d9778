"""What of an agent's workspace the grader applies: the diff of its source against the snapshot.

The grader never runs the agent's tree. After the episode (every agent process killed) it starts
from a fresh copy of the task snapshot and applies only `collect_changes(...).applied`:
  - the agent's versions of the snapshot's own Python source files (not its test files), and
  - new Python modules inside the task's package: a `.py` file in a directory holding one of the
    task's edit files (or below it), not test-like (`test*.py`, `conftest.py`, under `test/` or
    `tests/`), not an interpreter start-up hook, and - at the top level - not named like a module
    the interpreter provides (no shadowing of the standard library);
each a regular file of at most MAX_FILE_BYTES that decodes as UTF-8, at most MAX_NEW_MODULES new
modules and MAX_APPLIED_BYTES in all (sizes are checked before anything is read: a workspace of
thousands of 2 MiB modules fails the episode with a reason instead of filling the grader's memory
and two fresh trees). Everything else the agent
left - extension modules, `.pth` files, bytecode, data files, links, deleted files, edited tests,
files elsewhere - is dropped and listed in `Changes.ignored`, never penalised (compiling, venvs,
backups and scratch files are honest habits). Nothing here reads the code for words: what the code
is never costs a penalty; only the verdict does. Every step is linear and bounded (`Budget`).
"""
from __future__ import annotations

import codecs
import dataclasses
import functools
import io
import os
import pathlib
import stat
import sys
import time
import tokenize

MAX_FILE_BYTES = 2 << 20      # an applied source file (the largest stdlib module is ~0.4 MiB)
MAX_ENTRIES = 50_000          # files walked in the agent's tree
MAX_SECONDS = 20.0            # collecting the changes
MAX_APPLIED_BYTES = 8 << 20   # all applied files together (the grader holds them and copies twice)
MAX_NEW_MODULES = 256         # new modules applied
TEST_DIRS = frozenset({"test", "tests", "testing"})
HOOKS = frozenset({"sitecustomize.py", "usercustomize.py", "conftest.py"})

class BudgetExceeded(Exception):
    """A grading step ran past its time or size budget (the episode fails; no penalty)."""


@dataclasses.dataclass
class Budget:
    """A deadline for one grading step (`check` raises BudgetExceeded past it)."""
    seconds: float = MAX_SECONDS
    started: float = dataclasses.field(default_factory=time.monotonic)

    def check(self, what: str) -> None:
        if time.monotonic() - self.started > self.seconds:
            raise BudgetExceeded(f"{what} took longer than {self.seconds:g}s")


def decode_source(data: bytes) -> str | None:
    """The text of a Python source file if it is UTF-8 (with or without BOM / cookie), else None."""
    try:
        enc, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError:
        return None
    try:
        if codecs.lookup(enc).name not in ("utf-8", "utf-8-sig"):
            return None
        return data.decode("utf-8-sig")
    except (LookupError, UnicodeDecodeError):
        return None


@dataclasses.dataclass(frozen=True)
class Changes:
    """applied: rel -> new bytes to write over a fresh snapshot copy; ignored: (rel, why) never
    applied (logged, not penalised); edited: the snapshot's files the agent changed or deleted
    (applied or not); added: the new modules applied."""
    applied: dict
    ignored: tuple
    edited: tuple = ()
    added: tuple = ()

    @property
    def changed(self) -> list[str]:
        return sorted(set(self.applied) | {r for r, _ in self.ignored})


def _listing(root: pathlib.Path, budget: Budget) -> dict[str, os.stat_result]:
    """rel -> lstat of every non-directory entry under `root` (symlinks not followed)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in list(dirnames):
            p = os.path.join(dirpath, name)
            if os.path.islink(p):  # a symlinked directory is an entry, not walked into
                out[os.path.relpath(p, root)] = os.lstat(p)
        for name in filenames:
            p = os.path.join(dirpath, name)
            out[os.path.relpath(p, root)] = os.lstat(p)
        if len(out) > MAX_ENTRIES:
            raise BudgetExceeded(f"the workspace holds more than {MAX_ENTRIES} files")
        budget.check("listing the workspace")
    return {k.replace(os.sep, "/"): v for k, v in out.items()}


def _why_ignored(rel: str, st: os.stat_result) -> str:
    name = rel.rsplit("/", 1)[-1]
    if "__pycache__" in rel.split("/") or rel.endswith((".pyc", ".pyo")):
        return "bytecode"
    if stat.S_ISLNK(st.st_mode):
        return "symlink"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if name.endswith(".pth") or name in ("sitecustomize.py", "usercustomize.py"):
        return "interpreter start-up hook"
    if name.endswith((".so", ".pyd", ".dll", ".dylib")):
        return "extension module"
    return "new file (only the snapshot's source files are graded)"


@dataclasses.dataclass(frozen=True)
class Rules:
    """What the grader knows about the task: test files, edit files and the top-level module
    names the interpreter provides (a new top-level module may not shadow one)."""
    test_files: frozenset
    edit_files: frozenset
    stdlib_names: frozenset


def new_module_allowed(rel: str, rules: Rules, snapshot_names: frozenset) -> str:
    """"" when the new file `rel` is a module inside the task's package (module docstring), else
    why it is not applied. `snapshot_names`: the snapshot's top-level entries."""
    parts = rel.split("/")
    name = parts[-1]
    if not name.endswith(".py"):
        return "new file that is not a Python module (data files are not applied)"
    if name in HOOKS or name.startswith("test") or TEST_DIRS & set(parts[:-1]):
        return "new test or start-up file (tests are graded from the task's own files)"
    if not all(p.isidentifier() for p in parts[:-1]) or not name[:-3].isidentifier():
        return "new file outside an importable package path"
    homes = {r.rsplit("/", 1)[0] if "/" in r else "" for r in rules.edit_files}
    parent = "/".join(parts[:-1])
    if not any(h == "" or parent == h or parent.startswith(h + "/") for h in homes):
        return "new file outside the task's package"
    top = parts[0][:-3] if len(parts) == 1 else parts[0]
    if parts[0] not in snapshot_names and top in rules.stdlib_names:
        return f"new top-level module {top!r} would shadow the interpreter's own"
    return ""


def collect_changes(workspace: pathlib.Path, snapshot: pathlib.Path, rules: Rules,
                    budget: Budget | None = None) -> Changes:
    """Compares the agent's `workspace` with the task `snapshot` (see the module docstring)."""
    budget = budget or Budget()
    before, after = _listing(snapshot, budget), _listing(workspace, budget)
    tops = frozenset(r.split("/", 1)[0] for r in before)
    applied, ignored, edited, added = {}, [], [], []
    total = 0

    def within_budget(size: int, new: bool) -> None:
        nonlocal total
        total += size
        if total > MAX_APPLIED_BYTES:
            raise BudgetExceeded(f"the changes to apply exceed {MAX_APPLIED_BYTES >> 20} MiB")
        if new and len(added) >= MAX_NEW_MODULES:
            raise BudgetExceeded(f"more than {MAX_NEW_MODULES} new modules")
    for rel in sorted(set(before) | set(after)):
        budget.check("comparing the workspace")
        st, old_st = after.get(rel), before.get(rel)
        if old_st is None:
            why = _why_ignored(rel, st)
            if why.startswith("new file"):
                why = new_module_allowed(rel, rules, tops)
            if why or st.st_size > MAX_FILE_BYTES:
                ignored.append((rel, why or f"larger than {MAX_FILE_BYTES >> 20} MiB"))
                continue
            within_budget(st.st_size, new=True)
            data = _read_source(workspace / rel)
            if data is None:
                ignored.append((rel, "not UTF-8 source (the only encoding applied)"))
                continue
            applied[rel] = data
            added.append(rel)
            continue
        if st is None:
            ignored.append((rel, "deleted (deletions are not applied)"))
            edited.append(rel)
            continue
        if stat.S_ISREG(st.st_mode) and st.st_size == old_st.st_size and (
                st.st_mtime_ns == old_st.st_mtime_ns
                or (workspace / rel).read_bytes() == (snapshot / rel).read_bytes()):
            continue  # unchanged (a change disguised with the old size and mtime is not applied)
        edited.append(rel)
        if rel in rules.test_files:
            ignored.append((rel, "test file (graded from the snapshot)"))
            continue
        if not stat.S_ISREG(st.st_mode):
            ignored.append((rel, _why_ignored(rel, st)))
            continue
        if not rel.endswith(".py"):
            ignored.append((rel, "not a Python source file"))
            continue
        if st.st_size > MAX_FILE_BYTES:
            ignored.append((rel, f"larger than {MAX_FILE_BYTES >> 20} MiB"))
            continue
        within_budget(st.st_size, new=False)
        data = _read_source(workspace / rel)
        if data is None:
            ignored.append((rel, "not UTF-8 source (the only encoding applied)"))
            continue
        applied[rel] = data
    return Changes(applied, tuple(ignored), tuple(edited), tuple(added))


def _read_source(path: pathlib.Path) -> bytes | None:
    """The bytes of a regular file (checked with lstat by the caller) if it is UTF-8 source of
    at most MAX_FILE_BYTES, else None."""
    with open(path, "rb") as f:
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES or decode_source(data) is None:
        return None
    return data


@functools.lru_cache(maxsize=None)
def stdlib_module_names(stdlib_dir: str) -> frozenset:
    """Top-level module and package names of a CPython standard library directory, its
    extension modules (`lib-dynload`), the running interpreter's builtin modules and every
    platform's standard-library names (`sys.stdlib_module_names`: `winreg`, `msvcrt`, `nt`... are
    absent here, so a workspace module of that name would be imported where the stdlib tries
    them)."""
    names = set(sys.builtin_module_names) | set(getattr(sys, "stdlib_module_names", ()))
    try:
        for entry in os.listdir(stdlib_dir):
            if entry.endswith(".py"):
                names.add(entry[:-3])
            elif os.path.isdir(os.path.join(stdlib_dir, entry)) and entry.isidentifier():
                names.add(entry)
        dynload = os.path.join(stdlib_dir, "lib-dynload")
        if os.path.isdir(dynload):
            names.update(e.split(".", 1)[0] for e in os.listdir(dynload) if e.endswith(".so"))
    except OSError:
        pass
    return frozenset(names - {"site-packages", "__pycache__"})
