"""rl.behaviour_reward: the behaviour terms (valid/invalid calls, length, communication) rank a
group's episodes only where the task was resolved at least once (`rl/trained_reward.py`)."""
import dataclasses

import numpy as np
import pytest

from composer_jax.config import Config, RLConfig, TrainConfig
from composer_jax.config.rl import BehaviourReward
from composer_jax.errors import ConfigError
from composer_jax.inference.config import EngineConfig
from composer_jax.inference.engine import Engine
from composer_jax.model import init_model
from composer_jax.rl import objectives as obj
from composer_jax.rl import toy_tasks as tt
from composer_jax.rl.batch import make_batch
from composer_jax.rl.learner import ModelLearner
from composer_jax.rl.rollout import Rollout, Segment
from composer_jax.rl.trained_reward import behaviour_part, trained_rewards


def _reward(resolved=0.0, invalid=0.0, length=0.0, valid=0.0, comm=0.0, false_claim=0.0,
            outside=0.0, tampering=0.0):
    base = resolved
    total = base + valid + comm - invalid - length - false_claim - outside - tampering
    return {"resolved": resolved, "base": base, "invalid_calls": invalid, "length": length,
            "valid_calls": valid, "communication": comm, "false_claim": false_claim,
            "outside_edits": outside, "tampering": tampering, "total": total}


def _rollout(group, reward, n=6):
    trainable = np.arange(n) >= 2
    seg = Segment(tokens=np.arange(n), trainable=trainable, logprobs=np.where(trainable, -1.0, 0.0),
                  model_logprobs=np.where(trainable, -1.0, 0.0),
                  versions=np.where(trainable, 0, -1))
    return Rollout(f"task-{group}", group, [seg], reward)


def _groups():
    failed = [_rollout("f", _reward(invalid=0.10, length=0.02)),        # a failing edit call
              _rollout("f", _reward(length=0.01)),                      # gave up early
              _rollout("f", _reward(invalid=0.05, length=0.03, false_claim=0.2))]
    mixed = [_rollout("m", _reward(resolved=1.0, valid=0.05, length=0.02, comm=0.05)),
             _rollout("m", _reward(invalid=0.05, length=0.01)),
             _rollout("m", _reward(length=0.03))]
    return failed, mixed


def test_behaviour_terms_rank_episodes_only_in_groups_that_resolved():
    failed, mixed = _groups()
    rollouts = failed + mixed
    totals = np.array([r.total_reward for r in rollouts])
    np.testing.assert_allclose(trained_rewards(rollouts, "every_group"), totals)
    gated = trained_rewards(rollouts, BehaviourReward.RESOLVED_GROUPS)
    # the group where nothing resolved keeps the base and the integrity terms only: the false
    # claim still costs 0.2, the failing edit call and the turns cost nothing there
    np.testing.assert_allclose(gated[:3], [0.0, 0.0, -0.2])
    np.testing.assert_allclose(gated[3:], totals[3:])         # a mixed group: unchanged
    assert behaviour_part(mixed[0].reward) == pytest.approx(0.05 + 0.05 - 0.02)
    # group-relative advantages: the shorter failure no longer outranks the failing edit
    gids = np.array([0, 0, 0, 1, 1, 1])
    adv_every = np.asarray(obj.dr_grpo_advantages(totals, gids))
    adv_gated = np.asarray(obj.dr_grpo_advantages(gated, gids))
    assert adv_every[1] > adv_every[0]
    assert adv_gated[0] == pytest.approx(adv_gated[1])
    assert adv_gated[3] > 0.6 and adv_gated[3] == pytest.approx(adv_every[3], abs=1e-6)


def test_make_batch_trains_the_gated_rewards_and_keeps_error_penalties():
    failed, mixed = _groups()
    crashed = dataclasses.replace(_rollout("f", {"total": 0.0}), error="sandbox died")
    rollouts = failed + [crashed] + mixed
    batch = make_batch(rollouts, seq_len=8, router_replay=False, error_reward=-1.0,
                       behaviour="resolved_groups")
    np.testing.assert_allclose(batch["rewards"][:4], [0.0, 0.0, -0.2, -1.0])
    np.testing.assert_allclose(batch["rewards"][4:], [r.total_reward for r in mixed], rtol=1e-6)
    every = make_batch(rollouts, seq_len=8, router_replay=False, error_reward=-1.0)
    np.testing.assert_allclose(every["rewards"][:3], [r.total_reward for r in failed], rtol=1e-6)


def test_the_setting_is_validated_and_reaches_the_learner():
    assert RLConfig(behaviour_reward="resolved_groups").behaviour_reward is \
        BehaviourReward.RESOLVED_GROUPS
    with pytest.raises(ConfigError, match="behaviour_reward"):
        RLConfig(behaviour_reward="failed_groups")
    # one group of sampled episodes, none resolved, that differ only in their behaviour terms:
    # the step has a gradient with every_group and none with resolved_groups
    tok = tt.toy_tokenizer()
    dense = dataclasses.replace(tt.toy_model_config(tok.vocab_size), first_k_dense=2, num_layers=2)
    engine = Engine.from_model(init_model(dense, 0), EngineConfig(
        max_batch=2, max_len=64, capture_router=False, prefill_batch=2))
    sampled = tt.run_group(engine, tok, tt.make_tasks(1, 0), 2, max_new_tokens=6)
    rollouts = [dataclasses.replace(r, reward=_reward(invalid=0.05 * i, length=0.01))
                for i, r in enumerate(sampled)]
    norms = {}
    for behaviour in ("every_group", "resolved_groups"):
        cfg = Config(model=dense, rl=RLConfig(batch_groups=1, group_size=2, router_replay=False,
                                              behaviour_reward=behaviour),
                     train=TrainConfig(lr=1e-2, warmup_steps=0, schedule="constant"))
        learner = ModelLearner(cfg, lambda: init_model(dense, 0))
        _, metrics = learner.step(learner.init_state(), [rollouts])
        norms[behaviour] = metrics["grad_norm"]
    assert norms["every_group"] > 0 and norms["resolved_groups"] == 0.0
