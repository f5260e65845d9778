"""Resolving agent-supplied paths so that every file the host-side tools touch is inside the workspace.

Paths may be relative to the workspace root or absolute under the sandbox mount point
(`/workspace/...`). `..` may not climb out, and the fully resolved path (symlinks followed) must
stay inside the root, so a symlink planted by a sandboxed command cannot make a host-side tool read
or write outside. Writes additionally refuse to follow a symlink at the final component.
"""
from __future__ import annotations

import os
import pathlib

SANDBOX_ROOT = "/workspace"


class PathError(ValueError):
    """A path that is empty, malformed, or outside the workspace; the message says why."""


def to_relative(user_path: str) -> str:
    """Normalises an agent path to a workspace-relative POSIX path ("." for the root)."""
    if not isinstance(user_path, str) or not user_path.strip():
        raise PathError("path must be a non-empty string")
    if "\x00" in user_path:
        raise PathError("path contains a NUL byte")
    p = user_path.strip()
    if p == SANDBOX_ROOT or p.startswith(SANDBOX_ROOT + "/"):
        p = p[len(SANDBOX_ROOT):].lstrip("/") or "."
    elif p.startswith("/"):
        raise PathError(f"absolute path {user_path!r} is outside the workspace; use a path relative "
                        f"to the workspace root or under {SANDBOX_ROOT}/")
    norm = os.path.normpath(p)
    if norm == ".." or norm.startswith("../"):
        raise PathError(f"path {user_path!r} climbs out of the workspace")
    return norm


def resolve(root: pathlib.Path, user_path: str, *, for_write: bool = False) -> pathlib.Path:
    """The host path for `user_path` under `root`; PathError if it would leave the workspace."""
    rel = to_relative(user_path)
    candidate = root / rel
    real_root = os.path.realpath(root)
    real = os.path.realpath(candidate)
    if real != real_root and not real.startswith(real_root + os.sep):
        raise PathError(f"path {user_path!r} resolves outside the workspace (through a symlink)")
    if for_write and candidate.is_symlink():
        raise PathError(f"refusing to write through the symlink {user_path!r}")
    if candidate.is_file() and candidate.stat().st_nlink > 1:
        raise PathError(f"refusing to touch {user_path!r}: it is a hard link (it may alias a file "
                        f"outside the workspace)")
    return candidate


def display(root: pathlib.Path, path: pathlib.Path) -> str:
    """A workspace-relative POSIX path for messages."""
    try:
        return path.relative_to(root).as_posix() or "."
    except ValueError:
        return path.name
