"""It learns: the parity tasks (`composer_jax.rl.toy_tasks`, known optimum 1.0) through the real
path (engine sessions with router capture, chat template, Rollout records, make_batch, rl_step,
weight swap into the engine). CI: the unconditional variant (every task asks for even characters)
in 25 steps; slow: the full family (even and odd prompts: the policy must read the prompt)."""
import numpy as np
import pytest

from composer_jax.rl import toy_tasks as tt


def test_toy_grader_and_generator():
    tasks = tt.make_tasks(6, 0)
    assert [t.kind for t in tasks] == ["even", "odd"] * 3
    assert len({t.task_id for t in tasks + tt.make_tasks(6, 0, "eval")}) == 12
    even, odd = tasks[0], tasks[1]
    assert tt.grade(even, "bdfh<|im_end|>") == (1.0, True)       # b=98 d=100 f=102 h=104
    assert tt.grade(odd, "bdfh") == (0.0, False)
    assert tt.grade(even, "ab") == (0.5, False)
    assert tt.grade(even, "") == (0.0, False)
    assert tt.grade(even, "b<|tool_calls_section_begin|>") == (0.0, False)


def test_rl_step_raises_reward_ci():
    """25 steps at lr 1e-2 on the even-only variant: the mean reward of the last 5 steps is at
    least 0.3 above that of the first 5 (measured: 0.37 -> 1.0 by step 24)."""
    cfg = tt.toy_config(lr=1e-2)
    hist = tt.train_toy(cfg, steps=25, kinds=("even",))
    r = np.array([h["reward_mean"] for h in hist])
    assert r[-5:].mean() >= r[:5].mean() + 0.3, r.round(3).tolist()
    assert all(h["update_skipped"] == 0.0 for h in hist)
    assert "kl_k1" not in hist[0]                 # beta = 0: no reference policy, no KL pass
    assert max(h["mismatch_abs"] for h in hist) < 1e-3   # trainer == sampler (router replay)


@pytest.mark.slow
def test_rl_step_learns_parity_tasks_full():
    """300 steps at lr 3e-3 on even and odd prompts: from ~0.5 (a uniform policy) to >= 0.9 over
    the last 20 steps (measured: see benchmarks/results/rl_learning_curve.txt)."""
    cfg = tt.toy_config(lr=3e-3)
    hist = tt.train_toy(cfg, steps=300)
    r = np.array([h["reward_mean"] for h in hist])
    assert r[:20].mean() < 0.6
    assert r[-20:].mean() >= 0.9, r[-20:].round(3).tolist()
