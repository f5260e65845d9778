"""The cached forward pass against the full forward pass, and absorbed against naive MLA."""
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from composer_jax.inference.cache import cache_bytes_per_token, init_cache
from composer_jax.inference.forward import forward_cached, make_window
from composer_jax.inference.mla import mla_cached
from composer_jax.config import kimi_k2_5
from composer_jax.model.layers import Ctx


def test_absorbed_equals_naive(model):
    cfg = model.cfg
    gd, st = nnx.split(model.moe_layers)
    layer = nnx.merge(gd, jax.tree.map(lambda a: a[0], st))
    b, t, s = 2, 3, 16
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(b, t, cfg.hidden_size)), jnp.float32)
    c0 = jnp.asarray(rng.normal(size=(b, s, cfg.kv_lora_rank)), jnp.float32)
    kpe0 = jnp.asarray(rng.normal(size=(b, s, cfg.qk_rope_head_dim)), jnp.float32)
    pos = jnp.array([[5, 6, 7], [9, 10, 11]])
    ctx = Ctx(cfg)
    attn_gd, attn_st = nnx.split(layer.attn)
    run = jax.jit(lambda st, absorbed: mla_cached(nnx.merge(attn_gd, st), x, pos, pos, c0, kpe0, ctx,
                                                  absorbed=absorbed), static_argnums=1)
    outs = [run(attn_st, a) for a in (True, False)]
    err = float(jnp.max(jnp.abs(outs[0][0] - outs[1][0])))
    scale = float(jnp.max(jnp.abs(outs[1][0])))
    assert scale > 1e-3
    assert err <= 1e-5 * scale, err
    # the new latents were written at their positions; the rest of the cache is untouched
    np.testing.assert_array_equal(outs[0][1][:, :5], c0[:, :5])
    assert not np.allclose(outs[0][1][0, 5:8], c0[0, 5:8])


def test_cache_is_576_values_per_token_per_layer():
    cfg = kimi_k2_5()
    assert cache_bytes_per_token(cfg, dtype="bfloat16") == cfg.num_layers * 576 * 2


def test_cached_prefill_and_decode_match_full_forward(model, split):
    cfg = model.cfg
    graphdef, state = split
    toks = jnp.asarray(np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 14)), jnp.int32)
    full = jax.jit(lambda st, t: nnx.merge(graphdef, st)(t, with_mtp=False))(state, toks)
    lens = jnp.array([9, 6])   # per-row prompt lengths; row 1's prefill chunk is padded
    s = 32
    step = jax.jit(lambda st, cache, tok, starts, n: forward_cached(
        graphdef, st, cache, tok, make_window(starts, n, tok.shape[1], s)))
    cache = init_cache(cfg, 2, s)
    out, cache = step(state, cache, toks[:, :9], jnp.zeros(2, jnp.int32), lens)
    for r in range(2):
        n = int(lens[r])
        np.testing.assert_allclose(out.logits[r, :n], full.logits[r, :n], atol=2e-6, rtol=0)
        np.testing.assert_array_equal(out.router_indices[:, r, :n], full.router_indices[:, r, :n])
    worst = 0.0
    for i in range(5):   # decode one token per row at its own position
        pos = lens + i
        tok = jnp.take_along_axis(toks, pos[:, None], 1)
        out, cache = step(state, cache, tok, pos, jnp.ones(2, jnp.int32))
        ref = jnp.take_along_axis(full.logits, pos[:, None, None], 1)
        worst = max(worst, float(jnp.max(jnp.abs(out.logits - ref))))
        np.testing.assert_array_equal(
            out.router_indices[:, :, 0],
            jnp.take_along_axis(full.router_indices, pos[None, :, None, None], 2)[:, :, 0])
    assert worst <= 2e-6, worst


def _mixed_precision_model(quant_bf16_last_blocks=1):
    import dataclasses
    from inference_testlib import init_model, tiny2

    from composer_jax.config import ExecutionConfig
    cfg = dataclasses.replace(tiny2(), num_layers=3)
    execution = ExecutionConfig(precision="mxfp8", quant_bf16_last_blocks=quant_bf16_last_blocks)
    return cfg, init_model(cfg, seed=0, std=0.1, execution=execution)


def test_cached_forward_and_mtp_use_training_precision_under_mixed_precision():
    """precision=mxfp8 with quant_bf16_last_blocks=1 (layer 0 dense mxfp8, MoE layer 1 mxfp8,
    MoE layer 2 and the MTP modules BF16): the cached forward drives the layers with the training
    forward's driver, so prefill logits and the MTP module's logits equal the training forward's;
    quantizing every block instead moves them far beyond the tolerance (the check can fail)."""
    from composer_jax.inference.forward import mtp_cached
    from inference_testlib import log_softmax
    cfg, model = _mixed_precision_model()
    graphdef, state = nnx.split(model)
    prompt = [3, 14, 15, 92, 65, 35, 7, 200]
    n = len(prompt)
    toks = jnp.asarray([prompt], jnp.int32)
    win = make_window(jnp.zeros(1, jnp.int32), jnp.full(1, n), n, 16)

    @jax.jit
    def both(st):
        train = nnx.merge(graphdef, st)(toks)
        o, cache = forward_cached(graphdef, st, init_cache(cfg, 1, 16, with_mtp=True), toks, win)
        nxt = jnp.pad(toks[:, 1:], ((0, 0), (0, 1)))
        mtp = mtp_cached(graphdef, st, cache, 0, o.hidden, nxt, win)[0]
        return train.logits, train.mtp_logits[0], o.logits, mtp

    train, train_mtp, cached, mtp = both(state)
    np.testing.assert_allclose(log_softmax(cached[0]), log_softmax(train[0]), atol=1e-5, rtol=0)
    np.testing.assert_allclose(mtp[0, :n - 1], train_mtp[0, :n - 1], atol=2e-5, rtol=0)
    all_q = nnx.merge(*nnx.split(_mixed_precision_model(0)[1]))
    other = jax.jit(lambda t: all_q(t).logits)(toks)
    assert np.max(np.abs(log_softmax(other[0]) - log_softmax(train[0]))) > 1e-3


def test_engine_logprobs_equal_training_forward_under_mixed_precision():
    """The engine's temperature-1 logprobs of sampled tokens equal the training forward's
    log-softmax for precision=mxfp8 with quant_bf16_last_blocks=1."""
    import dataclasses

    from composer_jax.inference import Engine, SamplingParams
    from inference_testlib import ENGINE, log_softmax

    cfg, model = _mixed_precision_model()
    graphdef, state = nnx.split(model)
    eng = Engine(graphdef, state, dataclasses.replace(ENGINE, capture_router=False))
    prompt = [3, 14, 15, 92, 65, 35]
    rid = eng.submit(prompt, SamplingParams(temperature=1.0, max_new_tokens=6, seed=1))
    c = eng.run()[rid]
    seq = jnp.asarray([prompt + c.tokens], jnp.int32)
    out = jax.jit(lambda st, t: nnx.merge(graphdef, st)(t))(state, seq)
    ref = log_softmax(out.logits[0])[len(prompt) - 1:-1][np.arange(6), c.tokens]
    np.testing.assert_allclose(c.logprobs, ref, atol=1e-5)
    np.testing.assert_allclose(c.raw_logprobs, ref, atol=1e-5)
