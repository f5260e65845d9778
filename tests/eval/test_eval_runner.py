"""End to end on a one-task suite in the real sandbox: reference agents, regressions, quality,
behaviour and cost records, reports. (Each episode takes about a second.)"""
import json

import pytest

from composer_jax.env.config import EnvConfig
from composer_jax.env.protocol import render_assistant
from composer_jax.env.sandbox import bwrap_works
from composer_jax.eval.policies import Meter, Policy, ReferencePolicy
from composer_jax.eval.report import build_result, write_comparison, write_reports
from composer_jax.eval.runner import RunSettings, run_suite
from composer_jax.eval.suite import build_suite, load_suite
from eval_helpers import BUGGY, TESTS, make_pool, make_task

pytestmark = pytest.mark.skipif(not bwrap_works(), reason="bubblewrap is not usable here")


class Vandal(Policy):
    """Breaks `scale` (a passing test regresses), edits the tests, adds a stray file, claims success."""
    name = "vandal"

    def agent(self, task, task_dir, seed):
        plan = [("search_replace", {"file_path": "colorsys.py", "old_string": "v * k",
                                    "new_string": "v + k"}),
                ("write_file", {"file_path": "notes.py", "contents": "import os\n"}),
                ("write_file", {"file_path": "test_colorsys.py", "contents": TESTS + "\n# x\n"}),
                ("finish", {"message": "Done, everything works."})]
        meter, step = Meter(), [0]

        def run(messages):
            name, args = plan[min(step[0], len(plan) - 1)]
            step[0] += 1
            text = render_assistant("", [(name, args)], first_index=step[0] - 1)
            meter.add("p" * 400, 10)
            return text
        return run, meter


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    root = tmp_path_factory.mktemp("evalsuite")
    make_pool(root / "pool", [make_task()])
    build_suite(root / "pool", root / "suite", name="mini", size=1, min_median_lines=1)
    return load_suite(root / "suite")


def _run(suite, policy, samples=1, styles=("terse", "detailed")):
    st = RunSettings(samples=samples, styles=styles, concurrency=2, price_prompt_per_mtok=1.0,
                     price_cached_per_mtok=0.0, price_generated_per_mtok=10.0)
    return run_suite(suite, policy, EnvConfig(max_turns=60), st, progress=False)


def test_reference_agents_and_reports(suite, tmp_path):
    oracle = _run(suite, ReferencePolicy("oracle"), samples=2)
    null = _run(suite, ReferencePolicy("null"), styles=("terse",))
    heur = _run(suite, ReferencePolicy("heuristic"), styles=("terse",))
    assert [r["resolved"] for r in oracle] == [True] * 4
    assert {r["style"] for r in oracle} == {"terse", "detailed"}
    o = oracle[0]
    assert o["partial"] == 1.0 and o["regressions"] == 0 and o["tests_run_before_finish"]
    assert o["diff_lines"] == 2 and o["diff_ratio"] == 1.0 and o["new_pyflakes_warnings"] == 0
    assert o["out_of_scope_files"] == 0 and o["test_edits"] == 0 and not o["false_claim"]
    fresh = o["prompt_tokens"] - o["cached_prompt_tokens"]
    assert o["cached_prompt_tokens"] > 0 and o["turns"] == 3
    assert o["price"] == pytest.approx((fresh + 10 * o["generated_tokens"]) / 1e6)
    assert null[0]["resolved"] is False and null[0]["partial"] == 0.0 and null[0]["tool_calls"] == 1
    # the comparison flip `<=` -> `<` is exactly what the heuristic's repair tries
    assert heur[0]["resolved"] is True and heur[0]["claims_success"] and heur[0]["diff_lines"] == 2
    res = build_result(oracle, suite=suite, policy={"name": "oracle", "kind": "reference"},
                       settings={"samples": 2}, wall_s=1.0)
    assert res["summary"]["all"]["pass@2"] == 1.0 and res["suite_id"] == suite.suite_id
    paths = write_reports(res, tmp_path)
    assert json.loads(paths["json"].read_text())["summary"]["terse"]["resolved"] == 1.0
    assert "| terse | 1.000" in paths["md"].read_text() and paths["png"].stat().st_size > 1000
    nres = build_result(null, suite=suite, policy={"name": "null", "kind": "reference"},
                        settings={"samples": 1}, wall_s=1.0)
    cmp = write_comparison([res, nres], ["oracle", "null"], tmp_path)
    text = cmp["md"].read_text()
    assert "| oracle / terse | 1.000" in text and "| null / terse | 0.000" in text


def test_regressions_scope_test_edits_and_false_claims(suite):
    (r,) = _run(suite, Vandal(), styles=("detailed",))
    # v + k breaks test_scale; test_scale_empty ([] stays []) still passes
    assert r["resolved"] is False and r["regressions"] == 1
    assert r["regressed_tests"] == ["test_colorsys.TestMini.test_scale"]
    assert r["p2p_passed"] == 1 and r["p2p_total"] == 2
    assert r["out_of_scope_files"] == 1 and r["test_edits"] == 1
    assert r["false_claim"] and r["finished"] and r["tool_calls"] == 4
    assert r["prompt_tokens"] == 4 * 100 and r["cached_prompt_tokens"] == 3 * 100
    assert r["new_pyflakes_warnings"] == 1        # `import os` unused in the new notes.py
    assert BUGGY.count("v * k") == 1
