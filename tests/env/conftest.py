"""Fixtures for the environment tests: a small workspace directory and a fast config."""
from __future__ import annotations

import pathlib
import shutil

import pytest

from composer_jax.env.config import EnvConfig
from composer_jax.env.pythons import find_pythons

SAMPLE = '''"""A tiny module used by the environment tests."""


def add(a, b):
    """Return the sum of a and b."""
    return a + b


def clamp(x, lo, hi):
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


class Counter:
    def __init__(self):
        self.n = 0

    def bump(self, k=1):
        self.n += k
        return self.n
'''

@pytest.fixture
def sample_dir(tmp_path) -> pathlib.Path:
    d = tmp_path / "src"
    d.mkdir()
    (d / "mod.py").write_text(SAMPLE)
    (d / "test_mod.py").write_text(
        "import unittest\nimport mod\n\n\nclass T(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(mod.add(2, 3), 5)\n\n"
        "    def test_clamp(self):\n        self.assertEqual(mod.clamp(5, 0, 3), 3)\n")
    (d / "pkg").mkdir()
    (d / "pkg" / "notes.txt").write_text("alpha\nbeta\ngamma\n")
    return d


@pytest.fixture
def cfg() -> EnvConfig:
    version = sorted(find_pythons(), key=lambda v: tuple(map(int, v.split("."))))[-1]
    return EnvConfig(python_versions=(version,), command_timeout_s=10.0, use_embeddings=False)


MINI_POOL_MODULE = "graphlib"
MINI_POOL_KINDS = ("bug", "refactor", "large_feature")


@pytest.fixture(scope="session")
def mini_pool(tmp_path_factory):
    """One small real pool shared by the red-team and task-kind tests: bug, refactor and
    large_feature tasks on the newest CPython's stdlib `graphlib` (generated once per session).
    Returns (TaskPool, EnvConfig for episodes)."""
    from env_helpers import needs_bwrap_now
    needs_bwrap_now()
    from composer_jax.env.tasks.generate import generate_pool
    from composer_jax.env.tasks.pool import TaskPool

    version = sorted(find_pythons(), key=lambda v: tuple(map(int, v.split("."))))[-1]
    gen = EnvConfig(python_versions=(version,), modules=(MINI_POOL_MODULE,),
                    kinds=MINI_POOL_KINDS, num_tasks=6, max_tasks_per_module=6, package_sources=(),
                    use_embeddings=False, workers=1)
    root = tmp_path_factory.mktemp("mini_pool") / "pool"
    generate_pool(gen, root, progress=False)
    pool = TaskPool(root)
    kinds = sorted({t.kind for t in pool.tasks()})
    assert kinds == sorted(MINI_POOL_KINDS), f"mini pool has kinds {kinds}"
    return pool, EnvConfig(python_versions=(version,), command_timeout_s=10.0,
                           use_embeddings=False)
