"""The quantized dot: forward/gradient error vs bf16, backends agree, scaled_dot_general agreement, bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from composer_jax.errors import ConfigError
from composer_jax.quant import blockwise, quantize, quantized_matmul, quantized_ragged_dot
from composer_jax.quant.operands import quant, quant_weight

KEY = jax.random.PRNGKey(11)
# Relative Frobenius error vs the bf16 result for unit-normal data (measured ~0.04 / ~0.15 forward,
# ~0.05 / ~0.21 gradients): bounds with margin.
FWD_BOUND = {"mxfp8": 0.06, "nvfp4": 0.2}
GRAD_BOUND = {"mxfp8": 0.08, "nvfp4": 0.3}


def _rel(a, b):
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


def _data(m=48, k=72, n=40, g=None):
    x = jax.random.normal(jax.random.PRNGKey(0), (m, k))
    shape = (k, n) if g is None else (g, k, n)
    return x, jax.random.normal(jax.random.PRNGKey(1), shape) / np.sqrt(k)


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_forward_close_to_bf16(fmt):
    x, w = _data()
    x3 = x.reshape(3, 16, 72)
    ref = quantized_matmul(x3, w, "bf16")
    out = quantized_matmul(x3, w, fmt)
    assert out.shape == (3, 16, 40) and out.dtype == x.dtype
    assert 1e-4 < _rel(out, ref) < FWD_BOUND[fmt]


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_jnp_path_matches_blockwise_reference(fmt):
    x, w = _data()
    want = blockwise.block_scaled_matmul(quant(x, fmt, 1), quant_weight(w, fmt))[:, :40]
    np.testing.assert_allclose(quantized_matmul(x, w, fmt, backend="jnp"), want, rtol=1e-5, atol=1e-5)


def _grads(fn, x, w, fmt, backend="jnp"):
    loss = lambda x, w: jnp.sum(jnp.sin(fn(x, w, fmt, backend)))
    return jax.jit(jax.grad(loss, (0, 1)))(x, w)


DENSE = lambda x, w, fmt, b: quantized_matmul(x, w, fmt, KEY, backend=b)


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_gradients_close_to_bf16(fmt):
    x, w = _data()
    g_ref = _grads(DENSE, x, w, "bf16")
    g = _grads(DENSE, x, w, fmt)
    for a, b in zip(g, g_ref):
        assert 1e-4 < _rel(a, b) < GRAD_BOUND[fmt]


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_pallas_backend_matches_jnp(fmt):
    x, w = _data(20, 64, 24)
    np.testing.assert_allclose(quantized_matmul(x, w, fmt, backend="pallas"), quantized_matmul(x, w, fmt, backend="jnp"), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_pallas_backend_gradients_match_jnp(fmt):
    x, w = _data(20, 64, 24)
    for a, b in zip(_grads(DENSE, x, w, fmt, "pallas"), _grads(DENSE, x, w, fmt, "jnp")):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_mxfp8_forward_agrees_with_scaled_dot_general():
    x, w = _data(32, 128, 48)
    cfg = [jax.nn.get_scaled_dot_general_config("mxfp8")] * 3
    ref = jax.nn.scaled_dot_general(x[None], w.T[None], (((2,), (2,)), ((0,), (0,))), configs=cfg)[0]
    out = quantized_matmul(x, w, "mxfp8")
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)  # same scale rule: equal up to summation order


@pytest.mark.slow
def test_nvfp4_stochastic_gradients_depend_on_key():
    x, w = _data()
    f = lambda k: jax.grad(lambda w: jnp.sum(quantized_matmul(x, w, "nvfp4", k) ** 2))(w)
    assert not np.array_equal(f(jax.random.PRNGKey(1)), f(jax.random.PRNGKey(2)))
    np.testing.assert_array_equal(f(jax.random.PRNGKey(1)), f(jax.random.PRNGKey(1)))


RAGGED = lambda x, w, fmt, b: quantized_ragged_dot(x, w, GS, fmt, KEY, backend=b)
GS = jnp.asarray([10, 0, 25, 9], jnp.int32)


@pytest.mark.parametrize("fmt", ["mxfp8", pytest.param("nvfp4", marks=pytest.mark.slow)])
def test_ragged_forward_and_gradients(fmt):
    x, w = _data(50, 72, 40, g=4)
    ref = jax.lax.ragged_dot(x, w, GS)
    out = quantized_ragged_dot(x, w, GS, fmt)
    assert _rel(out, ref) < FWD_BOUND[fmt] and np.all(np.asarray(out)[44:] == 0)
    g_ref = _grads(RAGGED, x, w, "bf16")
    g = _grads(RAGGED, x, w, fmt)
    for a, b in zip(g, g_ref):
        assert _rel(a, b) < GRAD_BOUND[fmt]
    assert np.all(np.asarray(g[0])[44:] == 0) and np.all(np.asarray(g[1])[1] == 0)


def test_ragged_mxfp8_rows_equal_dense_per_group():
    x, w = _data(50, 72, 40, g=4)
    out = quantized_ragged_dot(x, w, GS, "mxfp8")
    np.testing.assert_allclose(out[10:35], quantized_matmul(x[10:35], w[2], "mxfp8"), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_ragged_pallas_backend_matches_jnp(fmt):
    x, w = _data(40, 64, 24, g=3)
    gs = jnp.asarray([7, 20, 5], jnp.int32)
    a = quantized_ragged_dot(x, w, gs, fmt, backend="pallas")
    np.testing.assert_allclose(a, quantized_ragged_dot(x, w, gs, fmt, backend="jnp"), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("call,match", [
    (lambda: quantized_matmul(jnp.ones((4, 32)), jnp.ones((32, 8)), "fp8"), "unsupported matmul precision"),
    (lambda: quantized_matmul(jnp.ones((4, 32)), jnp.ones((32, 8)), "mxfp8", backend="cuda"), "unknown quantized-dot backend"),
    (lambda: quantized_matmul(jnp.ones((4, 32), jnp.int32), jnp.ones((32, 8)), "mxfp8"), "dtype int32"),
    (lambda: quantized_matmul(jnp.ones((4, 32)), jnp.ones((31, 8)), "mxfp8"), "wants x"),
    (lambda: quantized_ragged_dot(jnp.ones((4, 32)), jnp.ones((2, 32, 8)), jnp.ones(3, jnp.int32), "nvfp4"), "group_sizes"),
    (lambda: quantized_ragged_dot(jnp.ones((4, 32)), jnp.ones((2, 32, 8)), jnp.ones(2), "nvfp4"), "integers"),
])
def test_dot_bad_input(call, match):
    with pytest.raises(ConfigError, match=match):
        call()
