"""Finds the CPython installations on this machine (the task sources and test interpreters).

Looked for, in order: $CJ_PYTHON_PREFIXES (colon-separated install prefixes), pyenv's versions
directory ($PYENV_ROOT or ~/.pyenv), and /usr (the system python3.X). A usable install has
`bin/pythonX.Y` and a full standard library with its `test/` package.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
import re


@dataclasses.dataclass(frozen=True)
class PythonInstall:
    """One CPython: `version` like "3.12", `full_version` like "3.12.1", its prefix, exe and stdlib."""
    version: str
    full_version: str
    prefix: str
    executable: str
    stdlib: str


def _probe(prefix: pathlib.Path, full_version: str) -> PythonInstall | None:
    m = re.match(r"^(3\.\d+)", full_version)
    if not m:
        return None
    ver = m.group(1)
    exe = prefix / "bin" / f"python{ver}"
    lib = prefix / "lib" / f"python{ver}"
    if exe.exists() and (lib / "test" / "support").is_dir() and (lib / "os.py").exists():
        return PythonInstall(ver, full_version, str(prefix), str(exe), str(lib))
    return None


@functools.lru_cache(maxsize=1)
def find_pythons() -> dict[str, PythonInstall]:
    """Maps "3.X" to the first usable install found (see the module docstring)."""
    found: dict[str, PythonInstall] = {}
    candidates: list[tuple[pathlib.Path, str]] = []
    for p in filter(None, os.environ.get("CJ_PYTHON_PREFIXES", "").split(":")):
        for exe in sorted(pathlib.Path(p, "bin").glob("python3.*")):
            if re.fullmatch(r"python3\.\d+", exe.name):
                candidates.append((pathlib.Path(p), exe.name[len("python"):]))
    root = pathlib.Path(os.environ.get("PYENV_ROOT", pathlib.Path.home() / ".pyenv")) / "versions"
    if root.is_dir():
        candidates += [(d, d.name) for d in sorted(root.iterdir()) if d.is_dir()]
    for exe in sorted(pathlib.Path("/usr/bin").glob("python3.*")):
        if re.fullmatch(r"python3\.\d+", exe.name):
            candidates.append((pathlib.Path("/usr"), exe.name[len("python"):]))
    for prefix, full in candidates:
        inst = _probe(prefix, full)
        if inst is not None and inst.version not in found:
            found[inst.version] = inst
    return found


def get_python(version: str) -> PythonInstall:
    """The install for "3.X"; KeyError naming the versions found if there is none."""
    pys = find_pythons()
    if version not in pys:
        raise KeyError(f"no usable CPython {version} found (with its test suite); found: "
                       f"{sorted(pys)}; set CJ_PYTHON_PREFIXES to add install prefixes")
    return pys[version]
