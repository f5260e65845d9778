"""The pure RL objectives against independent NumPy computations of their formulas."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from composer_jax.rl import objectives as obj

B, T, V = 4, 6, 5


def _np_log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(B, T, V)).astype(np.float32)
    targets = rng.integers(0, V, size=(B, T)).astype(np.int32)
    logp_np = np.take_along_axis(_np_log_softmax(logits.astype(np.float64)), targets[..., None], -1)[..., 0]
    logp_old = logp_np + rng.normal(scale=0.3, size=(B, T))
    behaviour = logp_old + rng.normal(scale=0.8, size=(B, T))
    adv = rng.normal(size=(B,))
    mask = (rng.random((B, T)) < 0.7).astype(np.float32)
    return logits, targets, logp_np, logp_old, behaviour, adv, mask


def _jax_grad(logits, targets, logp_old, behaviour, adv, mask, **kw):
    def f(lg):
        logp, _ = obj.token_logprobs(lg, jnp.asarray(targets))
        return obj.policy_loss(logp, jnp.asarray(logp_old, jnp.float32),
                               jnp.asarray(behaviour, jnp.float32), jnp.asarray(adv, jnp.float32),
                               jnp.asarray(mask), **kw)
    (loss, metrics), g = jax.value_and_grad(f, has_aux=True)(jnp.asarray(logits))
    return float(loss), metrics, np.asarray(g)


def _np_dlogits(dlogp, logits, targets):
    """Chain rule through log_softmax: d logp[b,t] / d logits[b,t,:] = onehot - softmax."""
    p = np.exp(_np_log_softmax(logits.astype(np.float64)))
    onehot = np.eye(V)[targets]
    return dlogp[..., None] * (onehot - p)


@pytest.mark.parametrize("kind", ["truncated_is", "ppo_clip"])
def test_policy_loss_gradient_matches_numpy(kind):
    logits, targets, logp, logp_old, beh, adv, mask = _inputs()
    c, eps, n = 1.5, 0.2, 37.0
    loss, m, g = _jax_grad(logits, targets, logp_old, beh, adv, mask, kind=kind, is_truncation=c,
                           clip_eps=eps, normalizer=n)
    w = np.minimum(np.exp(logp_old - beh), c)
    a = adv[:, None]
    if kind == "truncated_is":
        loss_np = -(mask * w * a * logp).sum() / n
        dlogp = -(mask * w * a) / n
    else:
        r = np.exp(logp - logp_old)
        unclipped, clipped = r * a, np.clip(r, 1 - eps, 1 + eps) * a
        loss_np = -(mask * w * np.minimum(unclipped, clipped)).sum() / n
        active = unclipped <= clipped                        # d/dlogp of the unclipped term is r*A
        dlogp = -(mask * w * a * r * active) / n
        assert 0 < float(m["clipped"]) < mask.sum()      # both branches are exercised
        assert float(m["clipped"]) == pytest.approx((mask * ~active).sum())
    assert loss == pytest.approx(loss_np, rel=1e-5)
    np.testing.assert_allclose(g, _np_dlogits(dlogp, logits, targets), rtol=2e-4, atol=1e-7)
    # metrics: IS weight and truncation counts, sampler mismatch (mean |.| and k3)
    raw = np.exp(logp_old - beh)
    assert float(m["tokens"]) == mask.sum()
    assert float(m["is_weight_sum"]) == pytest.approx((mask * w).sum(), rel=1e-5)
    assert float(m["is_truncated"]) == (mask * (raw > c)).sum() > 0
    assert float(m["is_weight_max"]) == pytest.approx(raw[mask > 0].max(), rel=1e-5)
    assert float(m["mismatch_abs_sum"]) == pytest.approx((mask * np.abs(logp_old - beh)).sum(), rel=1e-5)
    k3 = (raw - 1) - (logp_old - beh)
    assert float(m["mismatch_k3_sum"]) == pytest.approx((mask * k3).sum(), rel=1e-5)


def test_normalizer_is_a_constant_not_the_token_count():
    logits, targets, logp, logp_old, beh, adv, mask = _inputs(1)
    _, _, g1 = _jax_grad(logits, targets, logp_old, beh, adv, mask, normalizer=10.0)
    more = np.ones_like(mask)          # more tokens unmasked: existing tokens' gradients unchanged
    _, _, g2 = _jax_grad(logits, targets, logp_old, beh, adv, np.maximum(mask, more), normalizer=10.0)
    sel = mask > 0
    np.testing.assert_allclose(g1[sel], g2[sel], rtol=1e-6)
    _, _, g3 = _jax_grad(logits, targets, logp_old, beh, adv, mask, normalizer=20.0)
    np.testing.assert_allclose(g3, g1 / 2, rtol=1e-5, atol=1e-9)


def test_dr_grpo_advantages_numbers():
    r = np.array([1.0, 0.0, 0.5, 2.0, -1.0, 3.0], np.float32)
    g = np.array([7, 7, 7, 2, 2, 9])
    a = np.asarray(obj.dr_grpo_advantages(r, g))
    np.testing.assert_allclose(a, [0.5, -0.5, 0.0, 1.5, -1.5, 0.0], atol=1e-6)
    # no std normalisation: scaling rewards scales advantages
    np.testing.assert_allclose(obj.dr_grpo_advantages(10 * r, g), 10 * a, rtol=1e-6)
    # weights: an episode split into two segments (each weight 1/2) counts once in the mean
    r2 = np.array([1.0, 1.0, 0.0], np.float32)
    g2 = np.array([0, 0, 0])
    w2 = np.array([0.5, 0.5, 1.0], np.float32)
    np.testing.assert_allclose(obj.dr_grpo_advantages(r2, g2, w2), [0.5, 0.5, -0.5], atol=1e-6)
    # weight 0 rows (padding) do not move the mean
    w3 = np.array([1.0, 1.0, 1.0, 1.0, 0.0, 1.0], np.float32)
    a3 = np.asarray(obj.dr_grpo_advantages(r, g, w3))
    assert a3[3] == pytest.approx(0.0) and a3[0] == pytest.approx(0.5)


def test_kl_k1_per_sequence():
    rng = np.random.default_rng(3)
    old, ref = rng.normal(size=(3, 5)), rng.normal(size=(3, 5))
    mask = (rng.random((3, 5)) < 0.6).astype(np.float32)
    np.testing.assert_allclose(obj.kl_k1(old, ref, mask), ((old - ref) * mask).sum(-1), rtol=1e-5)
    # no gradient flows through the k1 (it is a reward term)
    g = jax.grad(lambda o: obj.kl_k1(o, jnp.asarray(ref), jnp.asarray(mask)).sum())(jnp.asarray(old))
    assert float(jnp.abs(g).sum()) == 0.0


@pytest.mark.parametrize("kind", ["truncated_is", "ppo_clip"])
def test_on_policy_beta0_equals_reinforce_with_group_mean_baseline(kind):
    """On-policy (behaviour = old = current policy), beta = 0: the gradient is REINFORCE with the
    group-mean baseline, -(1/n) sum_b (R_b - mean_group R) sum_t mask grad log pi."""
    logits, targets, logp, _, _, _, mask = _inputs(2)
    rewards = np.array([1.0, 0.0, 0.0, 3.0])
    groups = np.array([0, 0, 1, 1])
    beta = 0.0
    kl = np.asarray(obj.kl_k1(logp, logp, mask))
    adv = obj.dr_grpo_advantages(rewards - beta * kl, groups)
    _, m, g = _jax_grad(logits, targets, logp, logp, adv, mask, kind=kind, normalizer=8.0)
    baseline = np.array([0.5, 0.5, 1.5, 1.5])
    dlogp = -((rewards - baseline)[:, None] * mask) / 8.0
    np.testing.assert_allclose(g, _np_dlogits(dlogp, logits, targets), rtol=2e-4, atol=1e-7)
    assert float(m["is_truncated"]) == 0 and float(m["mismatch_abs_sum"]) == pytest.approx(0, abs=1e-5)


def test_is_truncation_caps_the_weight():
    # one token, sampler far less likely than the trainer: ratio e^3 ~ 20 is capped at 2
    logits = np.zeros((1, 1, V), np.float32)
    targets = np.zeros((1, 1), np.int32)
    logp = np.log(1.0 / V)
    old = np.full((1, 1), logp)
    beh = old - 3.0
    mask = np.ones((1, 1), np.float32)
    for cap in (1.0, 2.0, 50.0):
        _, m, g = _jax_grad(logits, targets, old, beh, np.ones(1), mask, is_truncation=cap,
                            normalizer=1.0)
        w = min(np.exp(3.0), cap)
        np.testing.assert_allclose(g, _np_dlogits(np.full((1, 1), -w), logits, targets), rtol=1e-5)
        assert float(m["is_weight_sum"]) == pytest.approx(w, rel=1e-5)
        assert float(m["is_truncated"]) == (1.0 if np.exp(3.0) > cap else 0.0)
    w = np.asarray(obj.truncated_is_weight(old, beh, 2.0))
    assert w.max() == 2.0


def test_policy_loss_rejects_bad_arguments():
    z = jnp.zeros((1, 1))
    with pytest.raises(ValueError, match="unknown kind"):
        obj.policy_loss(z, z, z, jnp.zeros(1), z, kind="grpo")
    with pytest.raises(ValueError, match="normalizer"):
        obj.policy_loss(z, z, z, jnp.zeros(1), z, normalizer=0.0)


def test_token_logprobs_and_entropy():
    logits = np.random.default_rng(5).normal(size=(2, 3, V)).astype(np.float32)
    targets = np.array([[0, 1, 2], [3, 4, 0]], np.int32)
    lp, ent = obj.token_logprobs(jnp.asarray(logits), jnp.asarray(targets))
    ls = _np_log_softmax(logits.astype(np.float64))
    np.testing.assert_allclose(lp, np.take_along_axis(ls, targets[..., None], -1)[..., 0], rtol=1e-5)
    np.testing.assert_allclose(ent, -(np.exp(ls) * ls).sum(-1), rtol=1e-5)
