"""The task pool on disk: one directory per task, a manifest, and a log of processed candidates.

  POOL/tasks/<task_id>/{task.json, snapshot/, solution/, grading_tests/, secret_cases.json}
  POOL/manifest.json      {"num_tasks", "kinds", "versions", "sources", "median_lines_changed"
                          (kind -> median), "tasks": [summary... with "lines_changed"]}
                          (atomic writes; sources counts "stdlib" and each "package==version")
  POOL/candidates.jsonl   one line per processed candidate (accepted or why rejected), so that an
                          interrupted generation resumes without redoing work
  POOL/baselines/<ver>.json  per-module baseline test outcomes (cache)
"""
from __future__ import annotations

import collections
import json
import os
import pathlib
import shutil
import statistics
import tempfile
import threading

from composer_jax.env.tasks.task import Task, load_task


def atomic_write_text(path: pathlib.Path, text: str) -> None:
    """Writes via a temp file in the same directory and os.replace (readers never see half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix="." + path.name + ".")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class TaskPool:
    """Thread-safe access to one pool directory."""

    def __init__(self, root: pathlib.Path):
        self.root = pathlib.Path(root)
        (self.root / "tasks").mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._tasks: dict[str, Task] = {}
        for d in sorted((self.root / "tasks").iterdir()):
            if (d / "task.json").is_file() and not d.name.startswith("."):
                self._tasks[d.name] = load_task(d)
        self._processed: set[str] = set()
        log = self.root / "candidates.jsonl"
        if log.exists():
            for line in log.read_text().splitlines():
                try:
                    self._processed.add(json.loads(line)["candidate"])
                except (json.JSONDecodeError, KeyError):
                    continue  # a torn last line from an interrupted run

    def tasks(self) -> list[Task]:
        with self._lock:
            return [self._tasks[k] for k in sorted(self._tasks)]

    def __len__(self) -> int:
        return len(self._tasks)

    def task_dir(self, task_id: str) -> pathlib.Path:
        return self.root / "tasks" / task_id

    def processed(self, candidate: str) -> bool:
        return candidate in self._processed

    def record(self, candidate: str, accepted: bool, reason: str) -> None:
        """Appends one processed candidate to the log."""
        with self._lock:
            self._processed.add(candidate)
            with open(self.root / "candidates.jsonl", "a") as f:
                f.write(json.dumps({"candidate": candidate, "accepted": accepted,
                                    "reason": reason}) + "\n")

    def add(self, task: Task, snapshot: dict[str, str], solution: dict[str, str],
            grading_tests: dict[str, str] | None = None) -> None:
        """Writes a task directory atomically (build in a temp dir, then rename) and the manifest.
        `grading_tests`: the full test files when tests are held back (`task.held_back`)."""
        final = self.task_dir(task.task_id)
        tmp = pathlib.Path(tempfile.mkdtemp(dir=self.root / "tasks", prefix="." + task.task_id))
        for sub, files in (("snapshot", snapshot), ("solution", solution),
                           ("grading_tests", grading_tests or {})):
            for rel, text in files.items():
                p = tmp / sub / rel
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_text(text, encoding="utf-8")
        (tmp / "task.json").write_text(json.dumps(task.to_json(), indent=1))
        with self._lock:
            if final.exists():
                shutil.rmtree(final)
            os.rename(tmp, final)
            self._tasks[task.task_id] = task
        self.write_manifest()

    def remove(self, task_id: str) -> None:
        """Drops a task: its directory is renamed out of sight first (readers never see half of
        it), then deleted, and the manifest rewritten."""
        final = self.task_dir(task_id)
        with self._lock:
            self._tasks.pop(task_id, None)
            if final.exists():
                gone = pathlib.Path(tempfile.mkdtemp(dir=self.root / "tasks", prefix=".removed-"))
                os.rename(final, gone / task_id)
                shutil.rmtree(gone, ignore_errors=True)
        self.write_manifest()

    def write_manifest(self) -> dict:
        tasks = self.tasks()
        manifest = {
            "num_tasks": len(tasks),
            "kinds": dict(sorted(collections.Counter(t.kind for t in tasks).items())),
            "versions": dict(sorted(collections.Counter(t.python_version for t in tasks).items())),
            "sources": dict(sorted(collections.Counter(t.source for t in tasks).items())),
            "median_lines_changed": {k: statistics.median(t.lines_changed for t in tasks
                                                          if t.kind == k)
                                     for k in sorted({t.kind for t in tasks})},
            "tasks": [{"task_id": t.task_id, "kind": t.kind, "python_version": t.python_version,
                       "module": t.module, "source": t.source, "split": t.split,
                       "lines_changed": t.lines_changed,
                       "num_fail_to_pass": len(t.fail_to_pass),
                       "num_held_back": len(t.held_back)} for t in tasks],
        }
        with self._lock:
            atomic_write_text(self.root / "manifest.json", json.dumps(manifest, indent=1))
        return manifest
