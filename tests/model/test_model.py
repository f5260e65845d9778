"""Unit tests of the model: shapes, dispatch equivalence, routing, MTP, causality, packing."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from composer_jax.config import (ExecutionConfig, MoEImpl, ModelConfig, RopeConfig, RopeScaling,
                                 bf16, tiny)
from composer_jax.model import init_model
from composer_jax.model import router as router_lib
from composer_jax.model import rope as rope_lib


@nnx.jit(static_argnames=("with_mtp",))
def _fwd(model, tokens, positions=None, segment_ids=None, router_replay=None,
         mtp_router_replay=None, with_mtp=True):
    return model(tokens, positions=positions, segment_ids=segment_ids, router_replay=router_replay,
                 mtp_router_replay=mtp_router_replay, with_mtp=with_mtp)


def _tokens(cfg, b=2, t=12, seed=0):
    return jax.random.randint(jax.random.key(seed), (b, t), 0, cfg.vocab_size)


def _with_bias(model, scale=0.3, seed=1):
    """Random router biases so that selection-only bias matters in the tests."""
    b = model.moe_layers.ffn.bias
    b[...] = scale * jax.random.normal(jax.random.key(seed), b[...].shape)
    return model


def test_shapes_and_dtypes():
    cfg = tiny()
    out = _fwd(init_model(cfg), _tokens(cfg))
    assert out.logits.shape == (2, 12, cfg.vocab_size) and out.logits.dtype == jnp.float32
    assert out.mtp_logits.shape == (cfg.mtp_depth, 2, 12, cfg.vocab_size)
    assert out.expert_counts.shape == (cfg.num_moe_layers, cfg.num_routed_experts)
    assert out.router_indices.shape == (cfg.num_moe_layers, 2, 12, cfg.num_experts_per_tok)
    # every token is routed to exactly K experts
    assert int(out.expert_counts.sum()) == cfg.num_moe_layers * 2 * 12 * cfg.num_experts_per_tok


def test_bf16_compute_runs():
    cfg = tiny()
    model = init_model(cfg, 0, bf16())
    assert model.embed[...].dtype == jnp.bfloat16
    out = _fwd(model, _tokens(cfg))
    assert out.logits.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(out.logits)))


def _loss_and_grads(model, tokens):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(p):
        out = nnx.merge(graphdef, p, rest)(tokens)
        return optax.softmax_cross_entropy_with_integer_labels(out.logits[:, :-1], tokens[:, 1:]).mean()

    return jax.jit(jax.value_and_grad(loss))(params)


def test_dense_and_ragged_dispatch_agree_forward_and_grad():
    cfg = dataclasses.replace(tiny(), n_group=2, topk_group=1)
    tokens = _tokens(cfg)
    ragged = _with_bias(init_model(cfg))
    dense = _with_bias(init_model(cfg, 0, ExecutionConfig(moe_impl=MoEImpl.DENSE)))
    np.testing.assert_allclose(_fwd(ragged, tokens).logits, _fwd(dense, tokens).logits, atol=1e-5, rtol=1e-5)
    l1, g1 = _loss_and_grads(ragged, tokens)
    l2, g2 = _loss_and_grads(dense, tokens)
    np.testing.assert_allclose(l1, l2, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-4)


def test_router_replay_reproduces_routing():
    cfg = tiny()
    model = _with_bias(init_model(cfg))
    tokens = _tokens(cfg)
    out = _fwd(model, tokens)
    # Change the selection biases: fresh routing changes, replayed routing must not.
    model.moe_layers.ffn.bias[...] = -model.moe_layers.ffn.bias[...] * 5
    fresh = _fwd(model, tokens)
    assert not np.array_equal(fresh.router_indices, out.router_indices)
    replay = _fwd(model, tokens, router_replay=out.router_indices, mtp_router_replay=out.mtp_router_indices)
    np.testing.assert_array_equal(replay.router_indices, out.router_indices)
    np.testing.assert_allclose(replay.logits, out.logits, atol=1e-6)


def test_group_limited_selection_stays_in_groups():
    cfg = dataclasses.replace(tiny(), num_routed_experts=16, num_experts_per_tok=4, n_group=4,
                              topk_group=2)
    scores = jax.nn.sigmoid(jax.random.normal(jax.random.key(0), (64, 16)))
    idx = np.asarray(router_lib.select_experts(scores, jnp.zeros(16), cfg))
    groups = idx // 4
    assert all(len(set(row)) <= 2 for row in groups)
    # The chosen groups are the ones with the best top-2 sums.
    gs = np.sort(np.asarray(scores).reshape(64, 4, 4), -1)[..., -2:].sum(-1)
    best = np.argsort(-gs, -1)[:, :2]
    for row, b in zip(groups, best):
        assert set(row) <= set(b)


def test_combine_weights_use_unbiased_scores():
    cfg = tiny()
    logits = jax.random.normal(jax.random.key(0), (10, cfg.num_routed_experts))
    bias = jnp.linspace(-1, 1, cfg.num_routed_experts)
    idx, w, scores = router_lib.route(logits, bias, cfg)
    chosen = np.take_along_axis(np.asarray(scores), np.asarray(idx), -1)
    np.testing.assert_allclose(w, chosen / chosen.sum(-1, keepdims=True) * cfg.routed_scaling_factor,
                               rtol=1e-6)


def test_bias_update_moves_load_towards_balance():
    cfg = dataclasses.replace(tiny(), num_routed_experts=8, num_experts_per_tok=2)
    # A skewed router: some experts score much higher for every token.
    x = jax.random.normal(jax.random.key(0), (512, 16))
    w = jax.random.normal(jax.random.key(1), (16, 8)) * 0.3
    logits = x @ w + jnp.linspace(-2, 2, 8)[None, :]
    bias = jnp.zeros(8)

    def imbalance(bias):
        idx, _, _ = router_lib.route(logits, bias, cfg)
        c = router_lib.expert_counts(idx, 8)
        return float(c.max() / c.mean()), c

    start, _ = imbalance(bias)
    for _ in range(300):
        _, c = imbalance(bias)
        bias = router_lib.update_bias(bias, c, 0.01)
    end, _ = imbalance(bias)
    assert start > 2.0 and end < 1.3, (start, end)


def test_sequence_balance_loss_option():
    cfg = tiny()
    out = init_model(cfg)(_tokens(cfg), balance_loss=True)   # train.seq_aux_loss_coef > 0
    # Perfectly balanced routing gives 1 * ... ; any routing gives a positive value.
    assert float(out.balance_loss) > 0
    assert float(_fwd(init_model(tiny()), _tokens(tiny())).balance_loss) == 0.0


def test_mtp_loss_nonzero_and_reaches_mtp_params():
    cfg = tiny()
    model = init_model(cfg)
    tokens = _tokens(cfg, t=16)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def mtp_loss(p):
        out = nnx.merge(graphdef, p, rest)(tokens)
        # depth 1 predicts token i+2
        return optax.softmax_cross_entropy_with_integer_labels(out.mtp_logits[0, :, :-2],
                                                               tokens[:, 2:]).mean()

    loss, grads = jax.jit(jax.value_and_grad(mtp_loss))(params)
    assert float(loss) > 1.0
    mtp_norm = optax.global_norm(grads["mtp"])
    assert float(mtp_norm) > 0
    assert float(optax.global_norm(grads["mtp"]["eh_proj"])) > 0
    # the shared head also receives gradient from the MTP loss
    assert float(jnp.abs(grads["lm_head"][...]).sum()) > 0


def test_causality():
    cfg = tiny()
    model = init_model(cfg)
    tokens = _tokens(cfg, b=1, t=16)
    changed = tokens.at[0, 10].set((tokens[0, 10] + 1) % cfg.vocab_size)
    a, b = _fwd(model, tokens).logits, _fwd(model, changed).logits
    np.testing.assert_allclose(a[0, :10], b[0, :10], atol=1e-6)
    assert np.max(np.abs(a[0, 10:] - b[0, 10:])) > 1e-4


def test_packing_equals_separate_sequences():
    cfg = tiny()
    model = init_model(cfg)
    doc1, doc2 = _tokens(cfg, b=1, t=7, seed=1), _tokens(cfg, b=1, t=9, seed=2)
    packed = jnp.concatenate([doc1, doc2], 1)
    seg = jnp.array([[1] * 7 + [2] * 9])
    pos = jnp.array([list(range(7)) + list(range(9))])
    out = _fwd(model, packed, positions=pos, segment_ids=seg, with_mtp=False)
    np.testing.assert_allclose(out.logits[:, :7], _fwd(model, doc1, with_mtp=False).logits, atol=2e-5)
    np.testing.assert_allclose(out.logits[:, 7:], _fwd(model, doc2, with_mtp=False).logits, atol=2e-5)


def test_padding_not_counted_in_loads():
    cfg = tiny()
    model = init_model(cfg)
    tokens = _tokens(cfg, b=1, t=10)
    seg = jnp.array([[1] * 6 + [0] * 4])
    out = _fwd(model, tokens, segment_ids=seg)
    assert int(out.expert_counts.sum()) == cfg.num_moe_layers * 6 * cfg.num_experts_per_tok


def _reference_yarn(dim, base, factor, orig, beta_fast, beta_slow):
    """Written from the YaRN paper's definitions (wavelength ratio r = L / lambda)."""
    import math
    out = []
    for i in range(dim // 2):
        theta = base ** (-2 * i / dim)
        # correction dims: d(b) = dim * ln(L / (2 pi b)) / (2 ln base)
        low = max(math.floor(dim * math.log(orig / (beta_fast * 2 * math.pi)) / (2 * math.log(base))), 0)
        high = min(math.ceil(dim * math.log(orig / (beta_slow * 2 * math.pi)) / (2 * math.log(base))),
                   dim - 1)
        gamma = min(max((i - low) / max(high - low, 1e-3), 0.0), 1.0)   # 0: extrapolate, 1: interp
        out.append(theta * (1 - gamma) + theta / factor * gamma)
    return np.array(out)


def test_yarn_frequencies_match_reference():
    rope = RopeConfig(theta=10000.0, scaling=RopeScaling.YARN, factor=40.0, original_max_position=4096,
                      beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0)
    inv, att = rope_lib.rope_frequencies(rope, 64)
    np.testing.assert_allclose(inv, _reference_yarn(64, 10000.0, 40.0, 4096, 32.0, 1.0), rtol=1e-6)
    assert att == 1.0   # mscale == mscale_all_dim
    assert abs(rope_lib.softmax_scale_multiplier(rope) - (0.1 * np.log(40) + 1) ** 2) < 1e-12
    plain, _ = rope_lib.rope_frequencies(RopeConfig(theta=10000.0), 64)
    assert inv[0] == plain[0] and abs(inv[-1] - plain[-1] / 40) < 1e-12


def test_rope_layouts_preserve_dot_products_under_permutation():
    x = jax.random.normal(jax.random.key(0), (1, 5, 2, 8))
    y = jax.random.normal(jax.random.key(1), (1, 5, 2, 8))
    inv, _ = rope_lib.rope_frequencies(RopeConfig(), 8)
    pos = jnp.arange(5)[None]
    cos, sin = rope_lib.rope_cos_sin(pos, inv, 1.0)
    perm = np.concatenate([np.arange(0, 8, 2), np.arange(1, 8, 2)])   # interleaved -> half layout
    a = rope_lib.apply_rope(x, cos, sin, True)
    b = rope_lib.apply_rope(x[..., perm], cos, sin, False)
    np.testing.assert_allclose(a[..., perm], b, atol=1e-6)
    # relative-position property: <R(p)x, R(q)y> depends on p - q only
    ya = rope_lib.apply_rope(y, cos, sin, True)
    d1 = jnp.sum(a[0, 3] * ya[0, 1], -1)
    cos2, sin2 = rope_lib.rope_cos_sin(pos + 7, inv, 1.0)
    d2 = jnp.sum(rope_lib.apply_rope(x, cos2, sin2, True)[0, 3]
                 * rope_lib.apply_rope(y, cos2, sin2, True)[0, 1], -1)
    np.testing.assert_allclose(d1, d2, atol=1e-5)


def test_plain_q_projection_when_q_lora_is_zero():
    cfg = dataclasses.replace(tiny(), q_lora_rank=0)
    model = init_model(cfg)
    assert hasattr(model.moe_layers.attn, "wq") and not hasattr(model.moe_layers.attn, "wq_a")
    assert _fwd(model, _tokens(cfg)).logits.shape[-1] == cfg.vocab_size


NAMED_REMAT = ("full", "minimal", "minimal_with_context", "save_dot_except_mlp",
               "save_dot_except_mlpwi", "save_qkv_proj", "save_out_proj")


def test_remat_policies_give_same_gradients():
    tokens = _tokens(tiny())
    base = _loss_and_grads(init_model(tiny()), tokens)[1]
    for policy in NAMED_REMAT:
        g = _loss_and_grads(init_model(tiny(), 0, ExecutionConfig(remat=policy)), tokens)[1]
        for a, b in zip(jax.tree.leaves(base), jax.tree.leaves(g)):
            np.testing.assert_allclose(a, b, atol=1e-6)


def _residual_bytes(policy, tokens):
    from jax._src.ad_checkpoint import saved_residuals
    model = init_model(tiny(), 0, ExecutionConfig(remat=policy))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(p):
        return jnp.mean(nnx.merge(graphdef, p, rest)(tokens).logits)
    return sum(a.size * a.dtype.itemsize for a, _ in saved_residuals(loss, params))


def test_named_remat_policies_save_what_they_name():
    tokens = _tokens(tiny())
    got = {p: _residual_bytes(p, tokens) for p in ("none",) + NAMED_REMAT}
    # each named policy keeps more than recomputing everything and less than keeping everything,
    # and a policy naming a superset of another's tags keeps more
    for p in NAMED_REMAT[1:]:
        assert got["full"] < got[p] < got["none"], got
    # (the FFN down output of this tiny model is no extra residual: mlpwi adds nothing)
    assert (got["save_qkv_proj"] < got["save_dot_except_mlp"] <= got["save_dot_except_mlpwi"]
            < got["minimal"] < got["minimal_with_context"]), sorted(got.items())
    assert got["save_out_proj"] < got["save_dot_except_mlp"], sorted(got.items())


def test_blocked_attention_equals_full_attention_with_packing():
    from composer_jax.model.attention import attend, attend_blocked, attention_mask
    b, t, h = 2, 37, 3
    q = jax.random.normal(jax.random.key(0), (b, t, h, 8))
    k = jax.random.normal(jax.random.key(1), (b, t, h, 8))
    v = jax.random.normal(jax.random.key(2), (b, t, h, 5))
    seg = jnp.array([[1] * 20 + [2] * 17, [1] * 30 + [0] * 7])
    idx = jnp.broadcast_to(jnp.arange(t), (b, t))
    ref = attend(q, k, v, attention_mask(seg, seg, idx, idx), 0.3)
    f = lambda q, k, v: attend_blocked(q, k, v, seg, seg, idx, idx, 0.3, kv_block=8)  # noqa: E731
    np.testing.assert_allclose(f(q, k, v), ref, atol=1e-5)
    g_ref = jax.grad(lambda *a: jnp.sum(jnp.sin(attend(*a, attention_mask(seg, seg, idx, idx), 0.3))),
                     argnums=(0, 1, 2))(q, k, v)
    g = jax.grad(lambda *a: jnp.sum(jnp.sin(f(*a))), argnums=(0, 1, 2))(q, k, v)
    for a, c in zip(g_ref, g):
        np.testing.assert_allclose(c, a, atol=1e-5)
    # and inside the model: a small kv block gives the same logits
    cfg = tiny()
    tokens = _tokens(cfg, t=20)
    ref_logits = _fwd(init_model(cfg), tokens).logits
    got = _fwd(init_model(cfg, 0, ExecutionConfig(attention_kv_block=8)), tokens).logits
    np.testing.assert_allclose(got, ref_logits, atol=2e-5)
