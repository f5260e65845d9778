"""`open_workspace(directory)`: a sandboxed, copy-on-write workspace over a task snapshot.

The snapshot directory is never modified: the workspace is a private scratch copy (on /dev/shm when
available) that the sandbox mounts writable at /workspace and the host-side tools edit through
`composer_jax.env.paths`. `call(tool_name, arguments)` runs one tool and returns a `ToolResult`
(`.output`, `.is_error`); closing the workspace kills every process it started and deletes the copy.

When the directory is a task snapshot (`<task>/snapshot` next to `<task>/task.json`, or `task=` is
given), every installed copy of the task's reference files (and of its test files when tests are
held back) is hidden inside the sandbox (`composer_jax.env.hide`).
"""
from __future__ import annotations

import contextlib
import difflib
import os
import pathlib
import shutil
import tempfile
from typing import Iterator

from composer_jax.env.config import EnvConfig, SandboxBackend, ShellMode
from composer_jax.env.hide import mounted_roots, overlays
from composer_jax.env.pythons import get_python
from composer_jax.env.sandbox import (Limits, PersistentShell, Sandbox, SandboxKilled, allocate_uid,
                                      killed_from_outside, resolve_backend, sandbox_python)
from composer_jax.env.tasks.task import load_task
from composer_jax.env.tools import ToolResult, dispatch
from composer_jax.env.tools.search import iter_files


def scratch_parent() -> str | None:
    """/dev/shm when it is a writable directory (fast, in memory), else the default temp dir."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


class Workspace:
    """One episode's workspace; use `open_workspace` to get one."""

    def __init__(self, source: pathlib.Path, config: EnvConfig, python_version: str | None,
                 hidden_files: tuple[str, ...] = ()):
        self.source = pathlib.Path(source).resolve()
        if not self.source.is_dir():
            raise FileNotFoundError(f"workspace source {source} is not a directory")
        self.config = config
        self.backend = resolve_backend(config.sandbox_backend)
        self.python = sandbox_python(get_python(python_version or config.python_versions[-1]),
                                     self.backend)
        self._tmp = pathlib.Path(tempfile.mkdtemp(prefix="cj-ws-", dir=scratch_parent()))
        os.chmod(self._tmp, 0o711)
        self.root = self._tmp / "ws"
        shutil.copytree(self.source, self.root, symlinks=True)
        self.uid = allocate_uid()
        if self.uid is not None:
            for p in [self.root, *self.root.rglob("*")]:
                os.lchown(p, self.uid, self.uid)
        self.hidden_files = tuple(hidden_files)
        self.overlays = self._overlays()
        self.sandbox = self.new_sandbox(self.root, self.uid)
        self.shell = PersistentShell(self.sandbox) if config.shell_mode == ShellMode.PERSISTENT else None
        self.num_calls = 0
        self.num_invalid_calls = 0

    def _overlays(self, tree: pathlib.Path | None = None, scratch: pathlib.Path | None = None,
                  trusted: frozenset = frozenset()) -> tuple[tuple[str, str], ...]:
        """Binds hiding every mounted copy of the task's reference files (bubblewrap only); each
        copy shows `tree`'s version of the file (default: the snapshot's), or the snapshot's when
        `tree` lacks it or the file is in `trusted` (edit files the graded process imports
        before the tests: those copies must stay the snapshot's)."""
        tree = tree or self.source
        texts = {}
        for r in self.hidden_files:
            for base in ((self.source,) if r in trusted else (tree, self.source)):
                p = base / r
                if p.is_file() and not p.is_symlink():
                    texts[r] = p.read_text(encoding="utf-8", errors="replace")
                    break
        if not texts or self.backend != SandboxBackend.BWRAP:
            return ()
        roots = mounted_roots((self.python.prefix,), self.config.extra_ro_binds)
        return overlays(texts, roots, scratch or (self._tmp / "hidden"))

    def new_sandbox(self, directory: pathlib.Path, uid: int | None, *,
                    scratch: pathlib.Path | None = None, trusted: frozenset = frozenset(),
                    extra_overlays: tuple[tuple[str, str], ...] = ()) -> Sandbox:
        """A sandbox over `directory` with this workspace's interpreter and limits. With `scratch`
        (the grader's sandbox over a fresh snapshot copy), the installed copies of the task's files
        show `directory`'s versions - the code being graded, so tests that start a subprocess
        importing the installed module see it too - except those in `trusted`, written under
        `scratch`; without, they show the snapshot's. `extra_overlays` (host file, sandbox path)
        are bound too (the graded test process, bubblewrap only)."""
        ov = self.overlays if scratch is None else self._overlays(directory, scratch, trusted)
        if self.backend == SandboxBackend.BWRAP:
            ov = tuple(ov) + tuple(extra_overlays)
        return Sandbox(directory, backend=self.backend, limits=Limits.from_config(self.config),
                       python_prefixes=(self.python.prefix,),
                       extra_ro_binds=self.config.extra_ro_binds, uid=uid, overlays=ov)

    def stop_processes(self) -> None:
        """Kills the persistent shell and every background job (before grading reads the tree)."""
        if self.shell is not None:
            self.shell.close()
        self.sandbox.close()

    # -- tools ----------------------------------------------------------------------------------
    def call(self, tool_name, arguments) -> ToolResult:
        """Runs one tool call; malformed calls return an error result (never raise)."""
        result = dispatch(self, tool_name, arguments)
        self.num_calls += 1
        self.num_invalid_calls += int(result.is_error)
        return result

    def run_command(self, command: str, *, timeout_s: float | None = None):
        """Runs a shell command in the sandbox (persistent shell if configured). SandboxKilled
        when the sandbox was killed from outside during the command (no result to show)."""
        if self.shell is not None:
            r = self.shell.run(command, timeout_s=timeout_s)
        else:
            r = self.sandbox.run(command, timeout_s=timeout_s)
        if killed_from_outside(r, self.backend):
            raise SandboxKilled(f"the sandbox of the command {command[:80]!r} was killed from "
                                f"outside (SIGKILL) after {r.duration_s:.1f}s")
        return r

    def give_to_sandbox(self, path: pathlib.Path) -> None:
        """Makes a file the host tools created editable by sandboxed commands."""
        if self.uid is not None:
            os.lchown(path, self.uid, self.uid)
            for parent in path.parents:
                if parent == self.root or self.root not in parent.parents:
                    break
                os.lchown(parent, self.uid, self.uid)

    # -- inspection -----------------------------------------------------------------------------
    def changed_files(self) -> list[str]:
        """Workspace-relative paths added, modified or deleted relative to the snapshot."""
        def listing(base):
            return {p.relative_to(base).as_posix(): p for p in iter_files(base)}
        before, after = listing(self.source), listing(self.root)
        changed = set(before) ^ set(after)
        for rel in set(before) & set(after):
            a, b = before[rel], after[rel]
            if a.stat().st_size != b.stat().st_size or a.read_bytes() != b.read_bytes():
                changed.add(rel)
        return sorted(changed)

    def diff(self) -> str:
        """Unified diff (snapshot -> workspace) of the changed text files."""
        out = []
        for rel in self.changed_files():
            a, b = self.source / rel, self.root / rel
            old = a.read_text(errors="replace").splitlines(True) if a.is_file() else []
            new = b.read_text(errors="replace").splitlines(True) if b.is_file() else []
            out += difflib.unified_diff(old, new, f"a/{rel}", f"b/{rel}")
        return "".join(out)

    def close(self) -> None:
        """Kills every process of this workspace and deletes the scratch copy."""
        if self.shell is not None:
            self.shell.close()
        self.sandbox.close()
        shutil.rmtree(self._tmp, ignore_errors=True)


def hidden_files(task) -> tuple[str, ...]:
    """The task files whose installed copies the sandbox hides: the edit files (the reference),
    and the test files when tests are held back (the installed tests hold them)."""
    return tuple(task.edit_files) + (tuple(task.test_files) if task.held_back else ())


def _task_edit_files(directory: pathlib.Path) -> tuple[str, ...]:
    """`hidden_files` of the task whose snapshot `directory` is (none if it is not one)."""
    meta = pathlib.Path(directory).resolve().parent / "task.json"
    if pathlib.Path(directory).name != "snapshot" or not meta.is_file():
        return ()
    return hidden_files(load_task(meta.parent))


@contextlib.contextmanager
def open_workspace(directory, config: EnvConfig | None = None, *,
                   python_version: str | None = None, task=None) -> Iterator[Workspace]:
    """Context manager: a sandboxed copy-on-write workspace over `directory` (see module doc).

    `python_version` ("3.12") picks the interpreter that `python` means inside; by default the
    newest of `config.python_versions`. `task` (a `Task`) names the files whose installed copies
    are hidden; by default they are read from `directory/../task.json` when that exists.
    """
    hidden = hidden_files(task) if task is not None else _task_edit_files(pathlib.Path(directory))
    ws = Workspace(pathlib.Path(directory), config or EnvConfig(), python_version, hidden)
    try:
        yield ws
    finally:
        ws.close()
