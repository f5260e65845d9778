"""A task: a workspace snapshot, a terse request, FAIL_TO_PASS / PASS_TO_PASS ids, the reference fix.

On disk (one directory per task, see `pool.py`):
  task.json    the `Task` fields
  snapshot/    the workspace before the fix (what the agent starts from)
  solution/    the fixed versions of the files the reference fix changes (`edit_files`)
  grading_tests/  the full test files when some FAIL_TO_PASS tests are held back (`held_back`):
               the snapshot's copies lack them; only the grader runs them
  secret_cases.json  input -> reference-output cases for the functions the fix changes
               (`composer_jax.env.secret`), never mounted in a sandbox
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import pathlib


@dataclasses.dataclass(frozen=True)
class Task:
    """One validated task.

    kind: bug | feature | migration | multi_bug | refactor | large_feature; python_version: the
    interpreter that runs the tests; source_version / test_version: where the module and the
    tests come from (they differ for migrations); edit_files: files the reference fix changes;
    test_files: files that define the tests (graded from the snapshot's version); lines_changed:
    changed lines of the reference patch.
    origin: "stdlib" or "package"; package / package_version: the package a package task comes
    from (its version is then also the source and test version).
    """
    task_id: str
    kind: str
    split: str
    python_version: str
    module: str
    problem_statement: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    edit_files: tuple[str, ...]
    test_files: tuple[str, ...]
    reference_patch: str
    lines_changed: int
    source_version: str
    test_version: str
    mutations: tuple[str, ...] = ()
    origin: str = "stdlib"
    package: str = ""
    package_version: str = ""
    held_back: tuple[str, ...] = ()   # FAIL_TO_PASS ids absent from the agent's test files

    @property
    def source(self) -> str:
        """Where the code comes from: "stdlib" or "package==version"."""
        return f"{self.package}=={self.package_version}" if self.package else "stdlib"

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Task":
        fields = {f.name for f in dataclasses.fields(cls)}
        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in fields}
        return cls(**kw)

    @property
    def test_ids(self) -> tuple[str, ...]:
        return self.fail_to_pass + self.pass_to_pass


def unified_patch(before: dict[str, str], after: dict[str, str]) -> tuple[str, int]:
    """(unified diff before -> after, number of changed lines) over the union of files."""
    out, changed = [], 0
    for rel in sorted(set(before) | set(after)):
        a = before.get(rel, "").splitlines(True)
        b = after.get(rel, "").splitlines(True)
        for line in difflib.unified_diff(a, b, f"a/{rel}", f"b/{rel}"):
            out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
            if line[:1] in "+-" and not line.startswith(("+++", "---")):
                changed += 1
    return "".join(out), changed


def load_task(task_dir: pathlib.Path) -> Task:
    return Task.from_json(json.loads((task_dir / "task.json").read_text()))


def read_files(directory: pathlib.Path, rels) -> dict[str, str]:
    return {r: (directory / r).read_text(encoding="utf-8") for r in rels}


def grading_test_files(task: Task, task_dir: pathlib.Path) -> dict[str, bytes]:
    """rel -> bytes of the test files the grader runs: `grading_tests/` (held-back tests
    included) where present, else the snapshot's."""
    task_dir = pathlib.Path(task_dir)
    out = {}
    for rel in task.test_files:
        for base in (task_dir / "grading_tests", task_dir / "snapshot"):
            if (base / rel).is_file():
                out[rel] = (base / rel).read_bytes()
                break
    return out
