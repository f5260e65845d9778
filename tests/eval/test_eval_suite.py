"""The versioned suite: selection by category and size, manifest hashes, prompts."""
import dataclasses
import os
import statistics

import pytest

from composer_jax.env.sandbox import bwrap_works
from composer_jax.eval.prompts import detailed_prompt, terse_prompt
from composer_jax.eval.suite import SuiteError, build_suite, load_suite, select_tasks
from eval_helpers import make_pool, make_task


def _tasks(spec):
    out = []
    for i, (kind, lines) in enumerate(spec):
        t, _, _ = make_task(f"{kind}-{i:03d}", kind=kind, lines=lines)
        t = dataclasses.replace(t, module=f"m{i % 3}")
        out.append(t)
    return out


def test_selection_reaches_the_median_and_keeps_every_category():
    tasks = _tasks([("bug", 2)] * 8 + [("multi_bug", 5)] * 4 + [("feature", 20)] * 5 +
                   [("large_feature", 80)] * 3 + [("migration", 60)] * 6 + [("refactor", 55)] * 3)
    chosen = select_tasks(tasks, size=12, min_median_lines=50)
    assert len(chosen) == 12 and len({t.task_id for t in chosen}) == 12
    assert statistics.median(t.lines_changed for t in chosen) >= 50
    kinds = {t.kind for t in chosen}
    assert {"bug", "multi_bug"} & kinds and {"feature", "large_feature"} & kinds
    assert "migration" in kinds and "refactor" in kinds
    # without enough large tasks the builder says so instead of quietly missing the target
    with pytest.raises(SuiteError, match="median"):
        select_tasks(_tasks([("bug", 2)] * 10 + [("migration", 60)] * 3), size=10, min_median_lines=50)


def test_build_load_and_tamper_detection(tmp_path):
    t1 = make_task("bug-3.12-mini-001")
    t2 = make_task("migration-3.11to3.12-mini", kind="migration", lines=70)
    t3 = make_task("bug-3.12-mini-002", split="train")         # never enters a suite
    make_pool(tmp_path / "pool", [t1, t2, t3])
    m = build_suite(tmp_path / "pool", tmp_path / "suite", name="t", size=2, min_median_lines=1)
    assert m["num_tasks"] == 2 and m["suite_id"].startswith("t-v1-")
    assert {e["task_id"] for e in m["tasks"]} == {"bug-3.12-mini-001", "migration-3.11to3.12-mini"}
    assert m["categories"]["debugging"] == 1 and m["categories"]["migration"] == 1
    assert set(m["tasks"][0]["files"]) == {"snapshot/colorsys.py", "snapshot/test_colorsys.py", "solution/colorsys.py"}
    # the same inputs give the same suite id
    m2 = build_suite(tmp_path / "pool", tmp_path / "suite2", name="t", size=2, min_median_lines=1)
    assert m2["suite_id"] == m["suite_id"]
    suite = load_suite(tmp_path / "suite")
    assert [st.category for st in suite.tasks] == ["debugging", "migration"]
    (tmp_path / "suite" / "tasks" / "bug-3.12-mini-001" / "solution" / "colorsys.py").write_text("x = 1\n")
    with pytest.raises(SuiteError, match="changed on disk"):
        load_suite(tmp_path / "suite")
    with pytest.raises(SuiteError, match="fewer than"):
        build_suite(tmp_path / "pool", tmp_path / "s3", name="t", size=3, min_median_lines=1)
    # an eval-split task over a module that is not held out is refused
    bad, before, after = make_task("bug-3.12-json-001")
    bad = dataclasses.replace(bad, edit_files=("json_helpers.py",))
    make_pool(tmp_path / "pool", [(bad, {**before, "json_helpers.py": "x = 1\n"}, {"json_helpers.py": "x = 2\n"})])
    with pytest.raises(SuiteError, match="outside the held-out"):
        build_suite(tmp_path / "pool", tmp_path / "s4", name="t", size=2, min_median_lines=1)


def test_prompts_terse_hides_tests_and_files_detailed_lists_them():
    task, _, _ = make_task()
    terse, detailed = terse_prompt(task, "debugging"), detailed_prompt(task, "debugging")
    for needle in ("test_", "colorsys.py", "count_below"):
        assert needle not in terse
    assert "colorsys" in terse and len(terse) < 120
    assert "colorsys.py" in detailed and "test_colorsys.TestMini.test_count_none" in detailed
    assert "python -m unittest test_colorsys" in detailed


@pytest.mark.skipif(not bwrap_works(), reason="bubblewrap is not usable here")
def test_the_oracle_check_excludes_a_task_its_reference_does_not_resolve(tmp_path):
    from composer_jax.env.config import EnvConfig
    from composer_jax.eval.suite import oracle_check
    from eval_helpers import BUGGY

    good = make_task("bug-3.12-mini-001", lines=4)
    broken, before, _ = make_task("bug-3.12-mini-002", lines=9)   # preferred: more lines
    make_pool(tmp_path / "pool", [good, (broken, before, {"colorsys.py": BUGGY})])
    m = build_suite(tmp_path / "pool", tmp_path / "suite", name="t", size=1, min_median_lines=1,
                    verify=oracle_check(EnvConfig(max_turns=1)))   # never cut: 3 turns run
    assert [e["task_id"] for e in m["tasks"]] == ["bug-3.12-mini-001"] and m["verified"]
    assert list(m["excluded"]) == ["bug-3.12-mini-002"]
    assert "fail-to-pass 0/2" in m["excluded"]["bug-3.12-mini-002"]
    unchecked = build_suite(tmp_path / "pool", tmp_path / "s2", name="t", size=1, min_median_lines=1)
    assert [e["task_id"] for e in unchecked["tasks"]] == ["bug-3.12-mini-002"]


def test_ensure_suite_reuses_the_loaded_suite_until_it_is_rebuilt(tmp_path):
    from composer_jax.config import Config, EvalConfig
    from composer_jax.eval.api import ensure_suite

    make_pool(tmp_path / "pool", [make_task("bug-3.12-mini-001")])
    build_suite(tmp_path / "pool", tmp_path / "suite", name="t", size=1, min_median_lines=1)
    cfg = dataclasses.replace(Config(), eval=EvalConfig(suite_dir=str(tmp_path / "suite")))
    first = ensure_suite(cfg, progress=False)
    assert ensure_suite(cfg, progress=False) is first
    manifest = tmp_path / "suite" / "manifest.json"
    build_suite(tmp_path / "pool", tmp_path / "suite", name="t", size=1, min_median_lines=1)
    st = manifest.stat()
    os.utime(manifest, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    again = ensure_suite(cfg, progress=False)
    assert again is not first and again.suite_id == first.suite_id
