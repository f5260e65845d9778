"""Metrics of the evaluation suite: pass@k against brute force, regressions, cost accounting."""
import itertools
import math

import pytest

from composer_jax.eval.metrics import (aggregate, common_prefix_len, episode_price, pass_at_k,
                                       regressions, task_summary)
from composer_jax.eval.policies import Meter
from composer_jax.eval.report import summarize


def brute_pass_at_k(outcomes, k):
    """Fraction of all k-subsets of the samples that contain at least one correct sample."""
    subsets = list(itertools.combinations(range(len(outcomes)), k))
    return sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_pass_at_k_matches_brute_force(n):
    for c in range(n + 1):
        outcomes = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(outcomes, k), abs=1e-12)


def test_pass_at_k_closed_form_values():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - math.comb(7, 5) / math.comb(10, 5))
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(200, 1, 100) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_regressions_detects_broken_and_missing_tests():
    before = {"a": "pass", "b": "pass", "c": "fail", "d": "pass"}
    after = {"a": "pass", "b": "fail", "c": "pass"}          # d did not run at all
    assert regressions(before, after, ["a", "b", "c", "d"]) == ["b", "d"]
    assert regressions(before, after, ["a", "c"]) == []


def test_episode_price_and_meter_cost_accounting():
    m = Meter()
    m.add([1, 2, 3, 4], generated=5)            # turn 1: nothing cached
    m.add([1, 2, 3, 4, 9, 9, 7], generated=2)    # turn 2: the first 4 tokens were sent before
    m.add([1, 2, 8], generated=1)                # turn 3: only a 2-token prefix is shared
    assert (m.prompt_tokens, m.cached_prompt_tokens, m.generated_tokens, m.turns) == (14, 6, 8, 3)
    price = episode_price(m.prompt_tokens, m.cached_prompt_tokens, m.generated_tokens,
                          prompt_per_mtok=1.0, cached_per_mtok=0.1, generated_per_mtok=10.0)
    assert price == pytest.approx((8 * 1.0 + 6 * 0.1 + 8 * 10.0) / 1e6)
    with pytest.raises(ValueError):
        episode_price(5, 6, 0, prompt_per_mtok=1, cached_per_mtok=1, generated_per_mtok=1)
    s = Meter()
    s.add("x" * 40, generated=3)
    s.add("x" * 40 + "y" * 40, generated=3)
    assert (s.prompt_tokens, s.cached_prompt_tokens) == (30, 10)
    assert common_prefix_len("abc", "abd") == 2


def _rec(task, style, resolved, price, cat="debugging"):
    return {"task_id": task, "style": style, "category": cat, "kind": "bug", "resolved": resolved,
            "partial": float(resolved), "price": price, "regressions": 0}


def test_summaries_pool_tasks_then_styles():
    recs = [_rec("t1", "terse", True, 1.0), _rec("t1", "terse", False, 3.0),
            _rec("t2", "terse", False, 2.0), _rec("t2", "terse", False, 2.0),
            _rec("t1", "detailed", True, 1.0), _rec("t1", "detailed", True, 1.0),
            _rec("t2", "detailed", True, 1.0, ), _rec("t2", "detailed", False, 1.0)]
    out = summarize(recs, samples=2)
    t = out["summary"]["terse"]
    assert t["resolved"] == pytest.approx(0.25) and t["pass@2"] == pytest.approx(0.5)
    assert t["price"] == pytest.approx(2.0) and t["num_tasks"] == 2
    d = out["summary"]["detailed"]
    assert d["pass@1"] == pytest.approx(0.75) and d["pass@2"] == pytest.approx(1.0)
    assert out["summary"]["all"]["resolved"] == pytest.approx(0.5)
    assert out["summary"]["all"]["num_rows"] == 4 and out["summary"]["all"]["num_tasks"] == 2
    row = task_summary([_rec("t", "terse", True, 1.0)] * 3, ks=[1, 3])
    assert row["pass@3"] == 1.0 and row["num_resolved"] == 3
    assert aggregate([], [1]) == {"num_tasks": 0}
