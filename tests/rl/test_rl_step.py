"""rl_step on rollouts sampled by the real engine: the loss and k1 KL against independent
computations, router replay reproducing the sampled forward, the batch layout of rollouts."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from composer_jax.config import Config, RLConfig, TrainConfig
from composer_jax.inference.config import EngineConfig
from composer_jax.inference.engine import Engine
from composer_jax.model import init_model
from composer_jax.rl import objectives as obj
from composer_jax.rl import toy_tasks as tt
from composer_jax.rl.batch import make_batch, replays_routers
from composer_jax.rl.learner import ModelLearner
from composer_jax.rl.rollout import Rollout
from composer_jax.rl.step import build_rl_step


def _sample_toy(temperature: float):
    """(tokenizer, model config, rollouts): a tiny MoE policy and 2 tasks x 2 episodes sampled from
    it at `temperature` with router capture."""
    tok = tt.toy_tokenizer()
    mcfg = tt.toy_model_config(tok.vocab_size)
    model = init_model(mcfg, 0)
    engine = Engine.from_model(model, EngineConfig(max_batch=4, max_len=64, capture_router=True,
                                                   prefill_batch=4))
    rollouts = tt.run_group(engine, tok, tt.make_tasks(2, 0), 2, max_new_tokens=6,
                            temperature=temperature)
    return tok, mcfg, rollouts


@pytest.fixture(scope="module")
def sampled():
    """A tiny MoE policy, and 2 tasks x 2 episodes sampled from it at T = 1."""
    return _sample_toy(1.0)


def _np_log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _logp(model, batch, replay=True):
    out = model(jnp.asarray(batch["tokens"]), positions=jnp.asarray(batch["positions"]),
                segment_ids=jnp.asarray(batch["segment_ids"]),
                router_replay=jnp.asarray(batch["router_replay"]) if replay else None,
                with_mtp=False)
    ls = _np_log_softmax(np.asarray(out.logits, np.float64))
    return np.take_along_axis(ls, batch["targets"][..., None], -1)[..., 0]


def test_batch_layout_of_rollouts(sampled):
    tok, mcfg, rollouts = sampled
    batch = make_batch(rollouts, seq_len=64, batch_size=6)
    for i, r in enumerate(rollouts):
        s = r.segments[0]
        t = len(s)
        np.testing.assert_array_equal(batch["tokens"][i, :t], s.tokens)
        np.testing.assert_array_equal(batch["targets"][i, :t - 1], s.tokens[1:])
        np.testing.assert_array_equal(batch["loss_mask"][i, :t - 1], s.trainable[1:])
        np.testing.assert_array_equal(batch["behaviour_logp"][i, :t - 1], s.logprobs[1:])
        np.testing.assert_array_equal(batch["router_replay"][:, i, :t - 1],
                                      np.moveaxis(s.router_indices[:t - 1], 1, 0))
        assert batch["rewards"][i] == np.float32(r.total_reward)
    assert batch["group_ids"].tolist()[:4] == [0, 0, 1, 1]
    assert batch["sample_weight"].tolist() == [1, 1, 1, 1, 0, 0]
    assert batch["loss_mask"][4:].sum() == 0 and batch["segment_ids"][4:].sum() == 0
    # the trainable targets are exactly the sampled tokens (and the sampler's logprobs are real)
    assert batch["loss_mask"][:4].sum() == sum(len(r.segments[0].sampled_text_ids().__next__())
                                               for r in rollouts)
    with pytest.raises(ValueError, match="exceeds seq_len"):
        make_batch(rollouts, seq_len=8)


def test_self_summarization_segments_share_the_reward(sampled):
    """An episode of 2 segments gives 2 rows with its reward and weight 1/2 each, so it counts
    once in its group's mean (advantages) and in reward_mean."""
    tok, mcfg, rollouts = sampled
    a, b = rollouts[0], rollouts[1]
    s = a.segments[0]
    split = Rollout(a.task_id, a.group_id, [s, dataclasses.replace(s)], {"total": 1.0},
                    rollout_id="two-segments")
    other = Rollout(b.task_id, a.group_id, b.segments, {"total": 0.0})
    batch = make_batch([split, other], seq_len=64)
    assert batch["rewards"].tolist() == [1.0, 1.0, 0.0]
    assert batch["sample_weight"].tolist() == [0.5, 0.5, 1.0]
    assert batch["episode_ids"].tolist() == [0, 0, 1]
    adv = obj.dr_grpo_advantages(batch["rewards"], batch["group_ids"], batch["sample_weight"])
    np.testing.assert_allclose(adv, [0.5, 0.5, -0.5], atol=1e-6)


def test_replayed_routes_give_the_sampled_forward_logits(sampled):
    """The trainer's forward with the experts recorded at sampling reproduces the engine's
    temperature-1 log-probs even when the router's selection biases have moved since sampling
    (as they do between RL steps); routing afresh does not."""
    tok, mcfg, rollouts = sampled
    batch = make_batch(rollouts, seq_len=64)
    model = init_model(mcfg, 0)
    bias = model.moe_layers.ffn.bias
    bias[...] = jnp.asarray(np.random.default_rng(0).normal(scale=3.0, size=bias[...].shape),
                            bias[...].dtype)
    sampled_raw = np.zeros_like(batch["behaviour_logp"])
    for i, r in enumerate(rollouts):
        s = r.segments[0]
        sampled_raw[i, :len(s) - 1] = s.model_logprobs[1:]
    m = batch["loss_mask"] > 0
    replayed = _logp(model, batch, replay=True)
    np.testing.assert_allclose(replayed[m], sampled_raw[m], atol=2e-4)
    fresh = _logp(model, batch, replay=False)
    assert np.abs(fresh[m] - sampled_raw[m]).max() > 1e-2


def test_rl_step_loss_and_kl_match_independent_computation(sampled):
    """Two rl_steps with beta > 0 and 2 microbatches: step 1's loss equals -(1/n) sum mask*w*A*logp
    recomputed from a plain forward (k1 = 0: the reference is the initial policy); step 2's kl_k1
    equals the sum of (logp_after_step_1 - logp_initial) over sampled tokens."""
    tok, mcfg, rollouts = sampled
    beta, n = 0.5, 16.0
    cfg = Config(model=mcfg, rl=RLConfig(kl_coef=beta, loss_normalizer=n, is_truncation=1.5),
                 train=TrainConfig(lr=3e-2, warmup_steps=0, microbatches=2, schedule="constant",
                                   weight_decay=0.0))
    model = init_model(mcfg, 0)
    fns, state = build_rl_step(model, cfg)
    assert fns.ref is not None
    batch = make_batch(rollouts, seq_len=64)
    batch["rewards"] = np.array([1.0, 0.25, 0.5, 0.0], np.float32)   # spread the advantages
    mask = batch["loss_mask"]
    logp0 = _logp(fns.merge(state.params, state.buffers), batch)
    adv = batch["rewards"] - np.repeat(batch["rewards"].reshape(2, 2).mean(1), 2)
    w = np.minimum(np.exp(logp0 - batch["behaviour_logp"]), 1.5)
    expect = -(mask * w * adv[:, None] * logp0).sum() / n
    state, m1 = fns.rl_step(state, batch)
    # the loss is a sum of terms of both signs (advantages are centred), so its float32 error is
    # relative to the terms' magnitude, not to the (cancelled) result
    scale = np.abs(mask * w * adv[:, None] * logp0).sum() / n
    assert float(m1["loss"]) == pytest.approx(expect, rel=1e-4, abs=1e-6 * scale)
    assert float(m1["kl_k1"]) == pytest.approx(0.0, abs=1e-5)
    assert float(m1["update_skipped"]) == 0.0 and float(m1["grad_norm"]) > 0
    assert float(m1["reward_mean"]) == pytest.approx(0.4375)
    assert float(m1["mismatch_abs"]) < 1e-4          # trainer == sampler at step 0 (replay)
    assert float(m1["entropy"]) > 0
    logp1 = _logp(fns.merge(jax.tree.map(jnp.copy, state.params), state.buffers), batch)
    kl_rows = np.asarray(obj.kl_k1(logp1, logp0, mask))
    assert np.abs(kl_rows).max() > 1e-3                  # the policy moved
    state, m2 = fns.rl_step(state, batch)
    assert float(m2["kl_k1"]) == pytest.approx(kl_rows.mean(), rel=2e-3, abs=1e-5)
    # the k1 went into the reward: the step-2 advantages are those of R - beta * k1
    adv2 = (batch["rewards"] - beta * kl_rows)
    adv2 = adv2 - np.repeat(adv2.reshape(2, 2).mean(1), 2)
    assert float(m2["advantage_abs_mean"]) == pytest.approx(np.abs(adv2).mean(), rel=1e-3)


def test_the_trainer_scores_the_distribution_sampled_at_rl_temperature():
    """Episodes sampled at rl.temperature = 0.5: the trainer's log-probs (logits / 0.5) are the
    sampler's, so the importance weights are 1 and nothing is truncated; a trainer scoring raw
    logits (temperature 1) would see a large mismatch on the same batch."""
    _, mcfg, rollouts = _sample_toy(0.5)
    batch = make_batch(rollouts, seq_len=64)
    batch["rewards"] = np.array([1.0, 0.0, 0.5, 0.0], np.float32)
    mismatch = {}
    for t in (0.5, 1.0):
        cfg = Config(model=mcfg, rl=RLConfig(temperature=t, loss_normalizer=16.0),
                     train=TrainConfig(lr=1e-3, warmup_steps=0, schedule="constant"))
        fns, state = build_rl_step(init_model(mcfg, 0), cfg)
        _, m = fns.rl_step(state, batch)
        mismatch[t] = float(m["mismatch_abs"])
        if t == 0.5:
            assert float(m["is_truncated_frac"]) == 0.0
            assert float(m["is_weight_mean"]) == pytest.approx(1.0, abs=5e-4)
    assert mismatch[0.5] < 2e-4
    assert mismatch[1.0] > 1e-2, mismatch
    with pytest.raises(Exception, match="rl.temperature=0"):
        RLConfig(temperature=0.0)


# ------------------------------------------------------------------------------------------------
# A real sandboxed oracle episode (issue 14's token-level agent), split by self-summarization,
# trains one rl_step
# ------------------------------------------------------------------------------------------------

GOOD = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
BAD = GOOD.replace("return a + b", "return a - b")
TESTS = ("import unittest\nimport mod\n\n\nclass T(unittest.TestCase):\n"
         "    def test_add(self):\n        self.assertEqual(mod.add(2, 3), 5)\n\n"
         "    def test_sub(self):\n        self.assertEqual(mod.sub(5, 3), 2)\n")


def _oracle_task(tmp_path):
    from composer_jax.env.pythons import find_pythons
    from composer_jax.env.tasks.pool import TaskPool
    from composer_jax.env.tasks.task import Task, unified_patch
    version = sorted(find_pythons(), key=lambda v: tuple(map(int, v.split("."))))[-1]
    pool = TaskPool(tmp_path / "pool")
    patch, n = unified_patch({"mod.py": BAD}, {"mod.py": GOOD})
    task = Task("t1", "bug", "train", version, "mod", "test_add fails; fix mod.py",
                ("test_mod.T.test_add",), ("test_mod.T.test_sub",), ("mod.py",),
                ("test_mod.py",), patch, n, version, version)
    pool.add(task, {"mod.py": BAD, "test_mod.py": TESTS}, {"mod.py": GOOD})
    return version, task, pool.task_dir("t1")


def test_sandboxed_oracle_rollout_trains_one_rl_step(tmp_path):
    """The oracle (forced through the engine by issue 14's TokenAgent) and the null agent on one
    sandboxed task; a low summary trigger splits the oracle episode into segments. make_batch +
    rl_step: every segment trains with the episode's reward, the episodes count once in
    reward_mean, the trainer reproduces the sampler's log-probs (router replay), and the update
    raises the log-likelihood of the resolving (positive-advantage) episode."""
    from composer_jax.data.config import SplitPattern
    from composer_jax.data.tokenizer import train_tokenizer
    from composer_jax.env import protocol as p
    from composer_jax.env.agents import OracleAgent, null_agent
    from composer_jax.env.config import EnvConfig
    from composer_jax.env.sandbox import bwrap_works
    from composer_jax.rl.agent import AgentConfig, ScriptedPolicy, TokenAgent
    from composer_jax.rl.rollout import END_SUMMARIZED
    if not bwrap_works():
        pytest.skip("bubblewrap is not usable here")
    version, task, d = _oracle_task(tmp_path)
    tok = train_tokenizer([p.SYSTEM_PROMPT, GOOD, TESTS] * 3, 512, SplitPattern.KIMI)
    mcfg = dataclasses.replace(tt.toy_model_config(512), name="tiny_oracle")
    model = init_model(mcfg, 0)
    env_cfg = EnvConfig(python_versions=(version,), command_timeout_s=10.0, use_embeddings=False)
    engine = Engine.from_model(model, EngineConfig(max_batch=2, max_len=2048,
                                                   capture_router=True)).start()
    acfg = AgentConfig(max_new_tokens=192, include_tool_specs=False, summary_trigger_tokens=600,
                       summary_max_tokens=32)
    summary = lambda msgs: "Fixed add in mod.py."                       # noqa: E731
    try:
        oracle = TokenAgent(engine, tok, acfg, env_cfg, ScriptedPolicy(OracleAgent(task, d), tok,
                                                                        summary=summary))
        r_good = oracle.run(task, d, group_id="g", rollout_id="oracle")
        null = TokenAgent(engine, tok, acfg, env_cfg, ScriptedPolicy(null_agent, tok))
        r_null = null.run(task, d, group_id="g", rollout_id="null")
    finally:
        engine.stop()
    assert r_good.error is None and r_null.error is None, (r_good.error, r_null.error)
    assert r_good.reward["resolved"] == 1.0 and r_null.reward["resolved"] == 0.0
    assert len(r_good.segments) >= 2 and r_good.segments[0].end_reason == END_SUMMARIZED
    k = len(r_good.segments)
    seq_len = -(-max(len(s) for r in (r_good, r_null) for s in r.segments) // 64) * 64
    batch = make_batch([r_good, r_null], seq_len=seq_len)
    assert batch["rewards"].tolist() == pytest.approx([r_good.total_reward] * k + [r_null.total_reward])
    assert batch["sample_weight"].tolist() == pytest.approx([1 / k] * k + [1.0])
    cfg = Config(model=mcfg, rl=RLConfig(loss_normalizer=256.0),
                 train=TrainConfig(lr=1e-2, warmup_steps=0, schedule="constant", weight_decay=0.0))
    fns, state = build_rl_step(model, cfg)
    before = _logp(fns.merge(state.params, state.buffers), batch)
    state, m = fns.rl_step(state, batch)
    mean = (r_good.total_reward + r_null.total_reward) / 2
    assert float(m["reward_mean"]) == pytest.approx(mean, rel=1e-5)
    assert float(m["resolved_rate"]) == pytest.approx(0.5)
    assert float(m["update_skipped"]) == 0.0 and float(m["grad_norm"]) > 0
    assert float(m["tokens"]) == batch["loss_mask"].sum() > 0
    assert float(m["mismatch_abs"]) < 1e-3 and float(m["is_truncated_frac"]) == 0.0
    after = _logp(fns.merge(state.params, state.buffers), batch)
    gain = ((after - before) * batch["loss_mask"]).sum(-1)
    adv = batch["rewards"] - mean
    assert adv[0] > 0 > adv[k]
    # the update ascends the surrogate sum_b A_b sum_t log pi: the resolving episode's segments
    # gain likelihood, and more than the null episode does
    assert (gain[:k] > 0).all() and (adv * gain).sum() > 0


@pytest.mark.slow
def test_rl_step_on_a_two_device_mesh_matches_one_device():
    """build_rl_step(mesh=...) (the builder's Placement, batch fields by RL_FIELDS, the reference
    sharded like the policy): two steps with beta > 0 on an fsdp=2 mesh of fake CPU devices give
    the one-device metrics."""
    import os
    import subprocess
    import sys

    from tests.parallel.device_subprocess import parse_results, subprocess_env
    script = os.path.join(os.path.dirname(__file__), "rl_mesh_case.py")
    out = subprocess.run([sys.executable, script], env=subprocess_env(), capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    results = parse_results(out.stdout)
    assert len(results) == 2
    for r in results:
        for k in ("loss", "kl_k1", "grad_norm", "entropy", "reward_mean"):
            assert r["mesh"][k] == pytest.approx(r["one"][k], rel=1e-4, abs=1e-6), k


def test_router_replay_on_an_all_dense_policy_trains_without_routes():
    """rl.router_replay (on by default) has nothing to act on in a model without MoE layers: the
    engine captures no routes, and the learner trains on the batch instead of refusing it; a MoE
    model's batch without routes is still refused."""
    tok = tt.toy_tokenizer()
    dense = dataclasses.replace(tt.toy_model_config(tok.vocab_size), first_k_dense=2, num_layers=2)
    assert dense.num_moe_layers == 0
    cfg = Config(model=dense, rl=RLConfig(batch_groups=1, group_size=2),
                 train=TrainConfig(lr=1e-2, warmup_steps=0, schedule="constant"))
    assert cfg.rl.router_replay and not replays_routers(cfg)
    assert replays_routers(dataclasses.replace(cfg, model=tt.toy_model_config(tok.vocab_size)))
    engine = Engine.from_model(init_model(dense, 0), EngineConfig(
        max_batch=2, max_len=64, capture_router=cfg.rl.router_replay, prefill_batch=2))
    rollouts = tt.run_group(engine, tok, tt.make_tasks(1, 0), 2, max_new_tokens=6)
    assert all(s.router_indices is None for r in rollouts for s in r.segments)
    rollouts[0] = dataclasses.replace(rollouts[0], reward={**rollouts[0].reward, "total": 1.0})
    learner = ModelLearner(cfg, lambda: init_model(dense, 0))
    _, metrics = learner.step(learner.init_state(), [rollouts])
    assert metrics["grad_norm"] > 0 and metrics["update_skipped"] == 0.0
    with pytest.raises(ValueError, match="carry no router indices"):
        make_batch(rollouts, seq_len=64, router_replay=True)
