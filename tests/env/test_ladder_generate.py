"""The ladder's generation end to end in the sandbox (slow: `-m slow`; CI runs test_ladder.py)."""
from __future__ import annotations

import re

import pytest

from composer_jax.agent.episode import run_episode
from composer_jax.env.agents import null_agent
from composer_jax.env.config import EnvConfig
from composer_jax.env.pythons import find_pythons
from composer_jax.env.tasks.ladder_generate import LadderSpec, generate_ladder
from composer_jax.env.tasks.ladder_plan import oracle_agent
from composer_jax.env.tasks.ladder_stats import pool_stats
from composer_jax.env.tasks.pool import TaskPool

from env_helpers import needs_bwrap


@pytest.mark.slow
@needs_bwrap
def test_ladder_tasks_are_verified_split_by_module_and_solved_only_by_the_fix(tmp_path):
    version = next((v for v in ("3.12", "3.13") if v in find_pythons()), None)
    if version is None:
        pytest.skip("no CPython 3.12+ (level-1 hints) here")
    cfg = EnvConfig(python_versions=(version,), modules=("getopt", "textwrap"), workers=1,
                    package_sources=(), max_tasks_per_module=2, use_embeddings=False)
    runs = generate_ladder(cfg, tmp_path / "pool", LadderSpec(train=2, heldout=2))
    assert {k: v["have"] for k, v in runs.items()} == {
        "level1/train": 2, "level1/eval": 2, "level2/train": 2, "level2/eval": 2}
    pool = TaskPool(tmp_path / "pool")
    stats = pool_stats(pool)
    assert stats["heldout_modules"] == ["textwrap"] and stats["modules_on_both_sides"] == []
    for task in pool.tasks():
        assert (task.split == "eval") == (task.module == "textwrap")
        d = pool.task_dir(task.task_id)
        oracle = run_episode(oracle_agent(task, d), task, d, cfg)
        null = run_episode(null_agent, task, d, cfg)
        assert oracle.grade.resolved and not null.grade.resolved, task.task_id
        first = oracle.calls[0]["output"]           # what the agent sees of the failing test
        named = re.search(rf'{task.edit_files[0]}", line \d+', first) is not None
        if task.kind == "level1":
            assert "Did you mean" in first or "keyword argument" in first, first
            assert named
