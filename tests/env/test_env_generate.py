"""Task generation end to end (short in CI; the full acceptance run is marked slow)."""
import dataclasses
import json

import pytest

from composer_jax.agent.episode import run_episode
from composer_jax.env.check import check_pool
from composer_jax.env.config import EnvConfig
from composer_jax.env.pythons import find_pythons
from composer_jax.env.tasks.generate import generate_pool
from composer_jax.env.tasks.pool import TaskPool

from env_helpers import needs_bwrap

pytestmark = needs_bwrap


def _versions(n):
    vs = sorted((v for v in find_pythons() if tuple(map(int, v.split("."))) >= (3, 11)),
                key=lambda v: tuple(map(int, v.split("."))))
    if len(vs) < n:
        pytest.skip(f"needs {n} CPython >= 3.11 installs with their test suites")
    return tuple(vs[-n:])


def test_generate_small_pool_validate_resume_and_check(tmp_path):
    cfg = EnvConfig(num_tasks=6, python_versions=_versions(1), kinds=("bug", "feature"),
                    max_tasks_per_module=2, use_embeddings=False)
    summary = generate_pool(cfg, tmp_path / "pool", progress=False)
    assert summary["num_tasks"] == 6 and set(summary["kinds"]) <= {"bug", "feature"}
    manifest = json.loads((tmp_path / "pool" / "manifest.json").read_text())
    assert manifest["num_tasks"] == 6 and len(manifest["tasks"]) == 6
    for t in TaskPool(tmp_path / "pool").tasks():
        d = tmp_path / "pool" / "tasks" / t.task_id
        assert t.fail_to_pass and set(t.fail_to_pass).isdisjoint(t.pass_to_pass)
        (rel,) = t.edit_files
        assert (d / "snapshot" / rel).read_text() != (d / "solution" / rel).read_text()
        assert t.reference_patch.startswith(f"--- a/{rel}") and t.lines_changed >= 1
        assert t.problem_statement and t.split == "train"
    # resuming does no new work
    again = generate_pool(cfg, tmp_path / "pool", progress=False)
    assert again["num_tasks"] == 6 and again["stats"].get("candidates", 0) == 0
    # oracle resolves everything, doing nothing resolves nothing
    out = check_pool(cfg, tmp_path / "pool", tmp_path / "check", play=run_episode, progress=False)
    assert out["oracle_resolved_rate"] == 1.0 and out["null_resolved_rate"] == 0.0
    written = json.loads((tmp_path / "check" / "env_check.json").read_text())
    assert written["num_tasks"] == 6 and sum(written["kinds"].values()) == 6
    rows = [json.loads(x) for x in (tmp_path / "check" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 7 and all("step" in r and "time" in r for r in rows)


@pytest.mark.slow
def test_acceptance_pool(tmp_path):
    """>= 200 validated tasks, >= 3 kinds, >= 2 versions; oracle >= 0.95, null == 0."""
    import time
    start = time.monotonic()
    cfg = EnvConfig(num_tasks=200, python_versions=_versions(2))
    summary = generate_pool(cfg, tmp_path / "pool", progress=False)
    assert time.monotonic() - start < 15 * 60
    assert summary["num_tasks"] >= 200 and len(summary["kinds"]) >= 3 and len(summary["versions"]) >= 2
    out = check_pool(dataclasses.replace(cfg, use_embeddings=False), tmp_path / "pool",
                     tmp_path / "check", play=run_episode, progress=False)
    assert out["oracle_resolved_rate"] >= 0.95 and out["null_resolved_rate"] == 0.0
