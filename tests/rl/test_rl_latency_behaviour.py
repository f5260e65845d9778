"""The environment-latency model of the benchmark, the per-batch behaviour metrics of coding
episodes, and `rl_async --set rl.task=coding` resolving to the coding settings (no JAX work)."""
import json

import numpy as np
import pytest

from composer_jax.rl import latency_model as lm
from composer_jax.rl.rollout import Rollout
from composer_jax.rl.services import behaviour_metrics


def test_latency_model_draws_measured_sandbox_episodes():
    raw = json.loads(lm.SAMPLES_FILE.read_text())
    samples = [s for p in raw["policies"].values() for s in p["episode_s"]]
    assert len(samples) == 160 and lm.measured_episode_seconds() == tuple(samples)
    assert lm.episode_latency(5, 0.0) == 0.0
    draws = [lm.episode_latency(seed, 0.1) for seed in range(2000)]
    assert draws == [lm.episode_latency(seed, 0.1) for seed in range(2000)]   # seeded
    assert set(np.round(np.array(draws) / 0.1, 4)) <= set(np.round(samples, 4))
    s = lm.summary(1.0)
    assert s["n"] == 160 and s["max_s"] == pytest.approx(max(samples))
    assert s["mean_s"] == pytest.approx(np.mean(samples))
    assert s["max_s"] / s["median_s"] > 10          # the heavy tail async RL overlaps
    assert abs(np.mean(draws) - 0.1 * s["mean_s"]) < 0.1 * 0.25 * s["mean_s"]


def _ep(calls, invalid, turns, tokens, reward):
    return Rollout("t", "g0000001", [], {"total": 0.0, **reward}, rollout_id="g0000001-s000",
                   info={"num_calls": calls, "num_invalid_calls": invalid, "num_turns": turns,
                         "generated_tokens": tokens})


def test_behaviour_metrics_of_a_batch():
    rs = [_ep(4, 1, 3, 100, {"effort": 2.0, "length": -0.01, "invalid_calls": 0.05}),
          _ep(2, 2, 2, 50, {"effort": 4.0, "length": -0.03, "invalid_calls": 0.1}),
          _ep(0, 0, 1, 10, {"effort": 0.0, "length": 0.0, "invalid_calls": 0.0})]
    m = behaviour_metrics(rs)
    assert m["valid_call_rate"] == pytest.approx(3 / 6)         # pooled over the batch
    assert m["tool_calls_mean"] == pytest.approx(2.0)
    assert m["invalid_calls_mean"] == pytest.approx(1.0)
    assert m["turns_mean"] == pytest.approx(2.0)
    assert m["generated_tokens_mean"] == pytest.approx(160 / 3)
    assert m["reward_effort_mean"] == pytest.approx(2.0)
    assert m["reward_length_mean"] == pytest.approx(-0.04 / 3)
    assert "valid_call_rate" not in behaviour_metrics([rs[2]])   # no call made: no rate
    parity = Rollout("t", "g0000001", [], {"total": 1.0}, rollout_id="g0000001-s001")
    assert behaviour_metrics([parity]) == {}


def test_rl_async_with_tasks_coding_takes_the_coding_settings():
    from composer_jax import registry
    from composer_jax.api import make_config
    from composer_jax.config import SECTION_PRESETS
    from composer_jax.errors import ConfigError
    from composer_jax.overrides import apply_overrides
    from experiments.rl import _coding_config
    exp = registry.get("rl_async")
    c = apply_overrides(exp.make_config(), ["rl.task=coding", "rl.steps=5", "rl.group_size=2"],
                        SECTION_PRESETS, rebase=exp.rebase)
    ref = _coding_config(2)
    assert c.rl.task.family == "coding"
    assert (c.rl.steps, c.rl.group_size) == (5, 2)                          # the user's values
    assert (c.rl.seq_len, c.rl.max_new_tokens, c.model) == (ref.rl.seq_len, ref.rl.max_new_tokens,
                                                             ref.model)     # coding defaults
    assert make_config("rl_async", ["rl.task=coding", "rl.steps=5", "rl.group_size=2"]) == c
    # a value the user set wins even where it equals the lookup default (eval_greedy=False,
    # max_turns=4 is the coding default and lookup's, num_rollout_workers 32 is lookup's)
    assert ref.rl.eval_greedy and not exp.make_config().rl.eval_greedy
    assert ref.rl.job.num_rollout_workers != exp.make_config().rl.job.num_rollout_workers
    kept = apply_overrides(exp.make_config(), ["rl.task=coding", "rl.eval_greedy=false",
                                               "rl.job.num_rollout_workers=32"],
                           SECTION_PRESETS, rebase=exp.rebase)
    assert not kept.rl.eval_greedy and kept.rl.job.num_rollout_workers == 32
    assert kept.rl.seq_len == ref.rl.seq_len
    from composer_jax.rl.task_program import TaskProgram
    from composer_jax.config import to_dict
    with pytest.raises(ConfigError, match="prepare"):
        TaskProgram(to_dict(c))            # pool and policy are resolved by the family's prepare first
