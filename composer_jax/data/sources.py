"""Where the corpus comes from: discovering library roots and listing their Python files.

Auto-discovery (when `DataConfig.source_roots` is empty) finds every CPython standard library on the
machine — pyenv versions under $PYENV_ROOT (default ~/.pyenv) and system ones in /usr/lib and
/usr/local/lib — plus, with `include_site_packages`, the site-packages of those interpreters and of
the running (virtual) environment. In site-packages only *pure-Python* top-level packages count: a
package directory that contains a compiled extension (.so/.pyd/.dylib) is skipped whole.

Explicit roots are plain directories of Python files (kind "dir"); a root that looks like
`.../lib/pythonX.Y` is treated as a standard library. Held-out modules (`composer_jax.heldout`) are
removed here, before anything is read.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import sys
import sysconfig

from composer_jax.errors import ConfigError
from composer_jax.heldout import is_heldout_path

_EXTENSION_SUFFIXES = (".so", ".pyd", ".dylib")
_SKIP_DIRS = {"__pycache__", "site-packages", "dist-packages", "lib-dynload"}


@dataclasses.dataclass(frozen=True)
class SourceRoot:
    """A directory of Python sources. kind: "stdlib" | "site-packages" | "dir"; python: e.g. "3.12.1"."""

    path: str
    kind: str
    python: str


@dataclasses.dataclass(frozen=True)
class SourceFile:
    """One candidate file: absolute path, its root, the path relative to the root, and its stat."""

    path: str
    root: SourceRoot
    relpath: str
    size: int
    mtime_ns: int


@dataclasses.dataclass
class Listing:
    """Candidate files plus what was skipped while listing (counts by reason)."""

    files: list[SourceFile]
    skipped: dict[str, int]


def discover_roots(include_site_packages: bool) -> list[SourceRoot]:
    """Every CPython stdlib (pyenv + system) and, optionally, the site-packages dirs on this machine."""
    roots: list[SourceRoot] = []
    pyenv = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    for lib in sorted(glob.glob(os.path.join(pyenv, "versions", "*", "lib", "python*"))):
        version = os.path.basename(os.path.dirname(os.path.dirname(lib)))
        roots += _stdlib_and_site(lib, version, include_site_packages)
    for lib in sorted(glob.glob("/usr/lib/python3*") + glob.glob("/usr/local/lib/python3*")):
        roots += _stdlib_and_site(lib, "system-" + os.path.basename(lib)[len("python"):], False)
    if include_site_packages:
        purelib = sysconfig.get_paths()["purelib"]
        if os.path.isdir(purelib):
            tag = "venv-" if sys.prefix != sys.base_prefix else ""
            roots.append(SourceRoot(purelib, "site-packages", f"{tag}{sys.version_info[0]}.{sys.version_info[1]}"))
    return _unique_roots(roots)


def explicit_roots(paths: tuple[str, ...]) -> list[SourceRoot]:
    """SourceRoots for user-given directories; a missing or unreadable one is a ConfigError."""
    roots = []
    for raw in paths:
        path = os.path.abspath(os.path.expanduser(raw))
        if not os.path.isdir(path) or not os.access(path, os.R_OK | os.X_OK):
            raise ConfigError(f"data.source_roots: {raw!r} is not a readable directory")
        match = re.search(r"python(\d+\.\d+)$", path)
        is_stdlib = match is not None and os.path.isfile(os.path.join(path, "os.py"))
        roots.append(SourceRoot(path, "stdlib" if is_stdlib else "dir", match.group(1) if is_stdlib else ""))
    return _unique_roots(roots)


def list_files(roots: list[SourceRoot]) -> Listing:
    """All non-held-out `.py` files under the roots, in a deterministic order."""
    files: list[SourceFile] = []
    skipped = {"heldout": 0, "extension_package": 0, "unreadable_dir": 0}
    for root in roots:
        for path in _walk_root(root, skipped):
            relpath = os.path.relpath(path, root.path).replace(os.sep, "/")
            if is_heldout_path(relpath):
                skipped["heldout"] += 1
                continue
            try:
                st = os.stat(path)
            except OSError:
                skipped["unreadable_dir"] += 1
                continue
            files.append(SourceFile(path, root, relpath, st.st_size, st.st_mtime_ns))
    return Listing(files, skipped)


def _stdlib_and_site(lib: str, version: str, include_site_packages: bool) -> list[SourceRoot]:
    if not os.path.isfile(os.path.join(lib, "os.py")):
        return []
    roots = [SourceRoot(lib, "stdlib", version)]
    site = os.path.join(lib, "site-packages")
    if include_site_packages and os.path.isdir(site):
        roots.append(SourceRoot(site, "site-packages", version))
    return roots


def _unique_roots(roots: list[SourceRoot]) -> list[SourceRoot]:
    seen, out = set(), []
    for root in roots:
        real = os.path.realpath(root.path)
        if real not in seen:
            seen.add(real)
            out.append(root)
    return out


def _walk_root(root: SourceRoot, skipped: dict[str, int]) -> list[str]:
    if root.kind != "site-packages":
        return _walk_py(root.path, skip_names=_SKIP_DIRS if root.kind == "stdlib" else {"__pycache__"},
                        skipped=skipped)
    paths: list[str] = []
    for entry in sorted(os.scandir(root.path), key=lambda e: e.name):
        name = entry.name
        if name.startswith(".") or name.endswith((".dist-info", ".egg-info")) or name == "__pycache__":
            continue
        if entry.is_file() and name.endswith(".py"):
            paths.append(entry.path)
        elif entry.is_dir():
            if _contains_extension(entry.path):
                skipped["extension_package"] += 1
                continue
            paths += _walk_py(entry.path, skip_names={"__pycache__"}, skipped=skipped)
    return paths


def _walk_py(top: str, skip_names: set[str], skipped: dict[str, int]) -> list[str]:
    def onerror(_err: OSError) -> None:
        skipped["unreadable_dir"] += 1

    paths = []
    for dirpath, dirnames, filenames in os.walk(top, onerror=onerror):
        dirnames[:] = sorted(d for d in dirnames if d not in skip_names and not d.startswith("."))
        paths += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py")]
    return paths


def _contains_extension(top: str) -> bool:
    for _dirpath, _dirnames, filenames in os.walk(top):
        if any(f.endswith(_EXTENSION_SUFFIXES) for f in filenames):
            return True
    return False
