"""Which modules can become tasks: the stdlib of each installed CPython, and installed packages that
ship their own test suite.

Stdlib source (`discover`): a single-file module `X.py` with a single-file test `test/test_X.py`.
Excluded: private/underscore modules, modules the interpreter imports at start-up (they cannot be
shadowed by the workspace copy), oversized modules.

Package source (`discover_packages`): a module `pkg/.../m.py` of an installed package named in
`env.package_sources`, tested by the package's own unittest suite (the `test_*.py` files in its
`test/` or `tests/` directories). The workspace holds a copy of the package's text files, without
compiled extensions: tasks are about the pure-Python code, and a package whose tests do not pass
that way fails its baseline and is dropped. Packages are looked for, in order, in `env.package_dirs`,
the running (virtual) environment's site-packages — what requirements.txt installs, so the source
that is reproducible on a clean machine — and each configured CPython's own site-packages. Their
tests run with the CPython of the site-packages they were found in; for the first two that is the
running interpreter's version (the newest configured one if that is not configured).

Held-out modules (`composer_jax.heldout`) apply by split: training tasks never use them, evaluation
tasks only use them. A package module is checked by its path relative to site-packages
("simplejson/decoder.py"), exactly as the pretraining corpus checks site-packages files: so a package
is held out (kept out of the corpus, evaluation tasks only) by listing its top-level name.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import json
import os
import pathlib
import subprocess
import sys
import sysconfig

from composer_jax.env.config import Split
from composer_jax.env.pythons import PythonInstall, find_pythons
from composer_jax.heldout import is_heldout_path

NEVER = frozenset({"antigravity", "this", "__future__", "__phello__", "site", "sitecustomize"})
TEST_DIRS = frozenset({"test", "tests"})
EXTENSION_SUFFIXES = (".so", ".pyd", ".dylib", ".dll")
MAX_PACKAGE_BYTES = 4 << 20


@dataclasses.dataclass(frozen=True)
class Package:
    """An installed package used as a task source.

    name: import name; version: its distribution's version ("" if no metadata); root: the
    directory holding `name/` (site-packages); files: paths relative to `root` copied into the
    workspace; test_files: those inside test directories; test_modules: dotted names of its
    `test_*.py` files; python_version: the CPython that runs its tests."""
    name: str
    version: str
    root: str
    files: tuple[str, ...]
    test_files: tuple[str, ...]
    test_modules: tuple[str, ...]
    python_version: str

    @property
    def label(self) -> str:
        """"name==version" (or just the name when the version is unknown)."""
        return f"{self.name}=={self.version}" if self.version else self.name


@dataclasses.dataclass(frozen=True)
class ModuleSource:
    """A module file and the tests that exercise it, run by one CPython (`version`).

    A stdlib source has `test_path` (its test file); a package source has `package`."""
    version: str
    module: str
    module_path: str
    test_path: str = ""
    package: Package | None = None

    @property
    def origin(self) -> str:
        return "package" if self.package else "stdlib"

    @property
    def module_file(self) -> str:
        """The module's path inside the workspace: "bisect.py", "simplejson/decoder.py"."""
        if self.package:
            return pathlib.Path(self.module_path).relative_to(self.package.root).as_posix()
        return f"{self.module}.py"

    @property
    def test_names(self) -> tuple[str, ...]:
        """The test modules that exercise this module (unittest names)."""
        return self.package.test_modules if self.package else ("test_" + self.module,)

    @property
    def test_files(self) -> tuple[str, ...]:
        """Workspace files that define the tests (restored before grading)."""
        return self.package.test_files if self.package else (f"test_{self.module}.py",)

    @property
    def test_label(self) -> str:
        """How a problem statement names the tests: "test_bisect.py", "simplejson/tests/"."""
        if not self.package:
            return self.test_files[0]
        dirs = sorted({str(pathlib.PurePosixPath(f).parent) for f in self.package.test_files})
        return dirs[0] + "/" if len(dirs) == 1 else f"the {self.package.name} test suite"

    def files(self, module_text: str) -> dict[str, str]:
        """The workspace files, with `module_text` as the module's content."""
        if self.package:
            out = dict(package_texts(self.package))
        else:
            out = {self.test_files[0]: pathlib.Path(self.test_path).read_text(encoding="utf-8")}
        out[self.module_file] = module_text
        return out


@functools.lru_cache(maxsize=None)
def preloaded_modules(executable: str) -> frozenset[str]:
    """Top-level modules the test runner cannot re-import from the workspace: those loaded at
    interpreter start-up and the runner's own (modules unittest pulls in later, such as difflib,
    are re-imported from the workspace by the runner)."""
    code = ("import sys, json\n"
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} | "
            "{'os', 'json', 'time', 'unittest', 'test'})))")
    out = subprocess.run([executable, "-S", "-c", code], capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin"})
    return frozenset(json.loads(out.stdout))


def _count_lines(path: pathlib.Path) -> int | None:
    try:
        return path.read_text(encoding="utf-8").count("\n")
    except (UnicodeDecodeError, OSError):
        return None


def _wanted(relpath: str, split: Split) -> bool:
    """True if a module at `relpath` (relative to its library root) belongs to `split`."""
    return is_heldout_path(relpath) == (split == Split.EVAL)


def discover(py: PythonInstall, split: Split, max_lines: int) -> list[ModuleSource]:
    """The candidate stdlib module sources of one install, sorted by name."""
    lib = pathlib.Path(py.stdlib)
    pre = preloaded_modules(py.executable)
    out = []
    for test in sorted((lib / "test").glob("test_*.py")):
        name = test.stem[len("test_"):]
        mod = lib / f"{name}.py"
        if not mod.is_file() or name.startswith("_") or name in NEVER or name in pre:
            continue
        if not _wanted(f"{name}.py", split):
            continue
        n = _count_lines(mod)
        if n is not None and n <= max_lines:
            out.append(ModuleSource(py.version, name, str(mod), str(test)))
    return out


# -- packages -------------------------------------------------------------------------------------
def _vkey(version: str) -> tuple[int, ...]:
    return tuple(map(int, version.split(".")))


def package_search_dirs(versions, extra_dirs=()) -> list[tuple[str, str]]:
    """(directory, CPython version that runs the tests of packages found there), in search order:
    `extra_dirs`, the running environment's site-packages, each configured CPython's own."""
    newest = max(versions, key=_vkey)
    own = f"{sys.version_info[0]}.{sys.version_info[1]}"
    default = own if own in versions else newest
    dirs = [(d, default) for d in extra_dirs]
    paths = sysconfig.get_paths()
    dirs += [(paths[k], default) for k in ("purelib", "platlib") if k in paths]
    pythons = find_pythons()
    for v in sorted(versions, key=_vkey, reverse=True):
        if v in pythons:
            dirs.append((os.path.join(pythons[v].stdlib, "site-packages"), v))
    seen, out = set(), []
    for d, v in dirs:
        real = os.path.realpath(d)
        if real not in seen and os.path.isdir(d):
            seen.add(real)
            out.append((d, v))
    return out


def distribution_version(site: str, name: str) -> str:
    """The version of the distribution in `site` that installs top-level package `name` ("" if
    there is no metadata)."""
    for dist in importlib.metadata.distributions(path=[site]):
        top = (dist.read_text("top_level.txt") or "").split()
        if name in top or any(f.parts[:1] == (name,) for f in dist.files or ()):
            return dist.version
    return ""


def _package_files(root: pathlib.Path, name: str) -> list[str] | None:
    """Relative paths of the package's copyable files (UTF-8 text, no caches or compiled
    extensions); None if they exceed MAX_PACKAGE_BYTES."""
    out, total = [], 0
    for dirpath, dirnames, filenames in os.walk(root / name):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
        for f in sorted(filenames):
            if f.endswith((".pyc", ".pyo") + EXTENSION_SUFFIXES) or f.startswith("."):
                continue
            path = pathlib.Path(dirpath) / f
            try:
                total += len(path.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, OSError):
                continue
            if total > MAX_PACKAGE_BYTES:
                return None
            out.append(path.relative_to(root).as_posix())
    return out


def _in_test_dir(rel: str) -> bool:
    return any(part in TEST_DIRS for part in rel.split("/")[1:-1])


def _dotted(rel: str) -> str:
    parts = rel[:-3].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def find_package(name: str, search_dirs) -> Package | None:
    """The first regular package `name` (a directory with __init__.py and test modules) in
    `search_dirs` (pairs from `package_search_dirs`), or None."""
    for d, version in search_dirs:
        root = pathlib.Path(d)
        if not (root / name / "__init__.py").is_file():
            continue
        files = _package_files(root, name)
        if files is None:
            continue
        tests = tuple(f for f in files if _in_test_dir(f))
        modules = tuple(_dotted(f) for f in tests
                        if f.endswith(".py") and f.rsplit("/", 1)[-1].startswith("test_"))
        if modules:
            return Package(name, distribution_version(d, name), str(root), tuple(files), tests,
                           modules, version)
    return None


@functools.lru_cache(maxsize=None)
def package_texts(pkg: Package) -> dict[str, str]:
    """The contents of the package's copied files (read once)."""
    return {f: pathlib.Path(pkg.root, f).read_text(encoding="utf-8") for f in pkg.files}


def package_modules(pkg: Package, py: PythonInstall, split: Split,
                    max_lines: int) -> list[ModuleSource]:
    """The module sources of one package: its non-test modules within `max_lines`, of `split`."""
    if pkg.name in preloaded_modules(py.executable) or pkg.name in NEVER:
        return []
    out = []
    for rel in pkg.files:
        base = rel.rsplit("/", 1)[-1]
        if not rel.endswith(".py") or _in_test_dir(rel) or base in ("__main__.py", "conftest.py") \
                or (base.startswith("_") and base != "__init__.py") or not _wanted(rel, split):
            continue
        n = _count_lines(pathlib.Path(pkg.root, rel))
        if n is not None and n <= max_lines:
            out.append(ModuleSource(py.version, _dotted(rel), str(pathlib.Path(pkg.root, rel)),
                                    package=pkg))
    return out


def discover_packages(names, versions, split: Split, max_lines: int,
                      extra_dirs=()) -> tuple[list[ModuleSource], list[str]]:
    """(module sources of the packages `names`, names not found) — see the module docstring."""
    if not names:
        return [], []
    dirs = package_search_dirs(tuple(versions), tuple(extra_dirs))
    pythons = find_pythons()
    out, missing = [], []
    for name in names:
        pkg = find_package(name, dirs)
        if pkg is None or pkg.python_version not in pythons:
            missing.append(name)
            continue
        out += package_modules(pkg, pythons[pkg.python_version], split, max_lines)
    return out, missing
