"""A tiny hand-made evaluation pool: one module with an injected comparison bug and its tests.

The module is named after a held-out stdlib module (`colorsys`) that nothing else imports, as an
evaluation task's module is; the workspace copy shadows the stdlib one, as in real tasks."""
from __future__ import annotations

import pathlib

from composer_jax.env.tasks.pool import TaskPool
from composer_jax.env.tasks.task import Task, unified_patch

FIXED = '''"""Small helpers."""


def count_below(xs, limit):
    """How many items are strictly below limit."""
    n = 0
    for v in xs:
        if v < limit:
            n += 1
    return n


def scale(xs, k):
    return [v * k for v in xs]
'''
BUGGY = FIXED.replace("if v < limit:", "if v <= limit:")
TESTS = '''import unittest

import colorsys as mini


class TestMini(unittest.TestCase):
    def test_count_below(self):
        self.assertEqual(mini.count_below([1, 2, 3], 2), 1)

    def test_count_none(self):
        self.assertEqual(mini.count_below([5, 6], 5), 0)

    def test_scale(self):
        self.assertEqual(mini.scale([1, 2], 3), [3, 6])

    def test_scale_empty(self):
        self.assertEqual(mini.scale([], 3), [])
'''


def make_task(task_id: str = "bug-3.12-mini-000", kind: str = "bug", split: str = "eval",
              lines: int | None = None, module: str = "colorsys") -> tuple[Task, dict, dict]:
    before = {"colorsys.py": BUGGY, "test_colorsys.py": TESTS}
    patch, changed = unified_patch({"colorsys.py": BUGGY}, {"colorsys.py": FIXED})
    task = Task(task_id=task_id, kind=kind, split=split, python_version="3.12", module=module,
                problem_statement="Tests in test_colorsys.py fail: `test_colorsys.TestMini.test_count_below`.",
                fail_to_pass=("test_colorsys.TestMini.test_count_below", "test_colorsys.TestMini.test_count_none"),
                pass_to_pass=("test_colorsys.TestMini.test_scale", "test_colorsys.TestMini.test_scale_empty"),
                edit_files=("colorsys.py",), test_files=("test_colorsys.py",), reference_patch=patch,
                lines_changed=changed if lines is None else lines, source_version="3.12",
                test_version="3.12", mutations=("compare_flip in count_below (line 8)",))
    return task, before, {"colorsys.py": FIXED}


def make_pool(root: pathlib.Path, tasks) -> TaskPool:
    pool = TaskPool(root)
    for task, before, after in tasks:
        pool.add(task, before, after)
    return pool
