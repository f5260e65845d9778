"""The step builder with a pluggable loss: a policy-gradient-like loss reading [B] and [B,T] fields
and router replay [Lm,B,T,K] through the same microbatching, denominators and placement as CPT."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from composer_jax.config import Config, TrainConfig, bf16, tiny
from composer_jax.data.config import DataConfig
from composer_jax.errors import ConfigError
from composer_jax.model import init_model
from composer_jax.parallel.batch_schema import LM_FIELDS, ROUTER_REPLAY_FIELDS, Field
from composer_jax.train.loss_api import LossSpec, get_loss, register_loss
from composer_jax.train.step import build, initial_state, make_step_fns

SCHEMA = LM_FIELDS.extend(ROUTER_REPLAY_FIELDS).extend({
    "advantages": Field("float32", ("batch",)),
    "behaviour_logp": Field("float32", ("batch", "seq")),
})


def _pg_loss(model, batch, ctx):
    out = ctx.forward(model, batch)
    logp = ctx.target_logprobs(model, out.normed, batch["targets"])
    mask = batch["loss_mask"]
    ratio = jnp.exp(logp - batch["behaviour_logp"])
    share = -jnp.sum(ratio * batch["advantages"][:, None] * mask) / ctx.denominators["norm"]
    match = jnp.sum((out.router_indices == batch["router_replay"]).astype(jnp.float32))
    return share, {"pg": share, "logp": jnp.sum(logp * mask), "match": match,
                   "adv_max": jnp.max(batch["advantages"])}


PG = register_loss(LossSpec(
    name="test_pg", fn=_pg_loss, schema=SCHEMA,
    denominators=lambda b: {"norm": jnp.asarray(64.0, jnp.float32),
                            "tokens": jnp.maximum(b["loss_mask"].sum(), 1.0)},
    metrics=lambda aux, d: {"pg": aux["pg"], "mean_logp": aux["logp"] / d["tokens"],
                            "replay_match": aux["match"], "adv_max": aux["adv_max"]},
    max_aux=("adv_max",)))


def _cfg(micro=1):
    return Config(model=tiny(), data=DataConfig(global_batch_size=4, vocab_size=512),
                  train=TrainConfig(steps=10, warmup_steps=0, microbatches=micro, loss="test_pg"))


def _batch(cfg, b=4, t=16, seed=0):
    rng = np.random.default_rng(seed)
    m = cfg.model
    toks = rng.integers(0, m.vocab_size, (b, t)).astype(np.int32)
    mask = np.ones((b, t), np.float32)
    mask[:, -1] = 0
    lm, k = m.num_layers - m.first_k_dense, m.num_experts_per_tok
    replay = np.stack([rng.permutation(m.num_routed_experts)[:k] for _ in range(lm * b * t)])
    return dict(tokens=toks, positions=np.tile(np.arange(t, dtype=np.int32), (b, 1)),
                segment_ids=np.ones((b, t), np.int32), targets=np.roll(toks, -1, 1),
                loss_mask=mask, mtp_targets=np.zeros((b, 1, t), np.int32),
                mtp_mask=np.zeros((b, 1, t), np.float32),
                router_replay=replay.reshape(lm, b, t, k).astype(np.int32),
                mtp_router_replay=np.zeros((1, b, t, k), np.int32) + np.arange(k, dtype=np.int32),
                advantages=rng.normal(size=(b,)).astype(np.float32),
                behaviour_logp=np.full((b, t), -6.0, np.float32))


def test_custom_loss_by_name_replays_routes_and_microbatches_exactly():
    cfg1, cfg2 = _cfg(1), _cfg(2)
    assert get_loss("test_pg") is PG
    b = _batch(cfg1)
    out = []
    for cfg in (cfg1, cfg2):
        fns, state = build(init_model(tiny()), cfg)      # the step donates the state
        assert fns.loss is PG
        out.append(fns.train_step(state, b))
    (s1, m1), (s2, m2) = out
    lm, bb, t, k = b["router_replay"].shape
    # the forward used the replayed expert indices, not its own routing (random replay indices)
    assert float(m1["replay_match"]) == float(m2["replay_match"]) == lm * bb * t * k
    np.testing.assert_allclose(m1["loss"], m2["loss"], rtol=1e-5)
    np.testing.assert_allclose(m1["mean_logp"], m2["mean_logp"], rtol=1e-5)
    np.testing.assert_allclose(m1["grad_norm"], m2["grad_norm"], rtol=1e-4)
    assert float(m1["grad_norm"]) > 0 and np.isfinite(float(m1["loss"]))
    # ratio = exp(logp + 6), so loss = -sum(ratio * A * mask) / 64 (never a constant)
    assert abs(float(m1["loss"])) > 1e-3
    # a max_aux key is max-reduced over microbatches (a sum of the two halves' maxima differs)
    adv = b["advantages"]
    assert float(m1["adv_max"]) == float(m2["adv_max"]) == float(adv.max())
    assert float(adv[:2].max() + adv[2:].max()) != float(adv.max())


def test_rl_policy_loss_max_reduces_is_weight_max():
    """The RL loss declares is_weight_max max-reduced (LossSpec.max_aux) and reports the
    accumulated value as is (no division by the number of microbatches)."""
    from composer_jax.rl.step import RL_POLICY_LOSS
    from composer_jax.train.step import _accumulate_aux, _aux_identity
    assert RL_POLICY_LOSS.max_aux == ("is_weight_max",)
    keys = ("tokens", "is_weight_sum", "is_weight_max", "is_truncated", "clipped",
            "mismatch_abs_sum", "mismatch_k3_sum", "entropy_sum")
    shapes = {"loss": jax.ShapeDtypeStruct((), jnp.float32),
              "aux": {k: jax.ShapeDtypeStruct((), jnp.float32) for k in keys}, "counts": None}
    acc = _aux_identity(shapes, RL_POLICY_LOSS.max_aux)
    for mb_max, mb_sum in ((1.5, 2.0), (3.25, 1.0), (0.5, 4.0)):   # three microbatches
        aux = {k: jnp.float32(mb_sum) for k in keys}
        aux["is_weight_max"] = jnp.float32(mb_max)
        acc = _accumulate_aux(acc, {"loss": jnp.float32(0.0), "aux": aux, "counts": None},
                              RL_POLICY_LOSS.max_aux)
    assert float(acc["aux"]["is_weight_max"]) == 3.25
    assert float(acc["aux"]["is_weight_sum"]) == 7.0
    denoms = {"tokens": jnp.float32(7.0), "reward_mean": 0.0, "resolved_rate": 0.0,
              "advantage_abs_mean": 0.0}
    assert float(RL_POLICY_LOSS.metrics(acc["aux"], denoms)["is_weight_max"]) == 3.25


def test_undeclared_or_misshapen_fields_are_named():
    cfg = _cfg()
    fns, state = build(init_model(tiny()), cfg)
    b = _batch(cfg)
    with pytest.raises(ConfigError, match="'extra' is not declared"):
        fns.train_step(state, dict(b, extra=np.zeros((4,), np.float32)))
    with pytest.raises(ConfigError, match="'advantages'.*rank"):
        fns.train_step(state, dict(b, advantages=np.zeros((4, 16), np.float32)))


def test_unknown_loss_name_lists_registered():
    cfg = dataclasses.replace(_cfg(), train=dataclasses.replace(_cfg().train, loss="nope"))
    with pytest.raises(ConfigError, match="'lm'"):
        build(init_model(tiny()), cfg)


def test_master_fp32_keeps_updates_of_1e7_relative_size():
    """An update of 1e-7 x |w| survives in the fp32 master copy and rounds away in bf16 params,
    while the forward runs in bf16 either way (the two steps' losses are bitwise equal)."""
    import optax
    model_cfg = tiny()
    shrink = optax.GradientTransformation(
        lambda p: optax.EmptyState(),
        lambda g, s, p: (jax.tree.map(lambda w: (-1e-7 * w.astype(jnp.float32)), p), s))
    results = {}
    for master in ("", "float32"):
        cfg = Config(model=model_cfg, execution=bf16(),
                     data=DataConfig(global_batch_size=4, vocab_size=512),
                     train=TrainConfig(steps=10, warmup_steps=0, master_dtype=master,
                                       microbatches=2))
        fns, state = build(init_model(model_cfg, 0, cfg.execution), cfg)
        step, _ = make_step_fns(fns.graphdef, fns.abstract_params, fns.abstract_buffers, shrink,
                                cfg)
        state = initial_state(state.params, state.buffers, shrink, fns.master_dtype)
        before = jax.tree.map(np.asarray, state.params)
        new, m = jax.jit(step)(state, _lm_batch())
        changed = [np.mean(np.asarray(a) != b) for a, b in
                   zip(jax.tree.leaves(new.params), jax.tree.leaves(before))
                   if np.asarray(b).size > 64]
        results[master] = (float(np.mean(changed)), m["loss"], new.params)
    frac_bf16, loss_bf16, p_bf16 = results[""]
    frac_fp32, loss_fp32, p_fp32 = results["float32"]
    assert jax.tree.leaves(p_bf16)[0].dtype == jnp.bfloat16
    assert jax.tree.leaves(p_fp32)[0].dtype == jnp.float32
    assert frac_bf16 == 0.0
    assert frac_fp32 > 0.99
    assert float(loss_bf16) == float(loss_fp32)


def _lm_batch(b=4, t=16):
    rng = np.random.default_rng(0)
    toks = rng.integers(0, 256, (b, t)).astype(np.int32)
    m = np.ones((b, t), np.float32)
    return dict(tokens=toks, positions=np.tile(np.arange(t, dtype=np.int32), (b, 1)),
                segment_ids=np.ones((b, t), np.int32), targets=np.roll(toks, -1, 1), loss_mask=m,
                mtp_targets=np.roll(toks, -2, 1)[:, None], mtp_mask=m[:, None])
