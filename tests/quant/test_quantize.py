"""Reference quantizer: exact scale rule, oracle agreement, edge cases, error bounds, bad input."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from composer_jax.errors import ConfigError
from composer_jax.quant import dequantize, quantize, random_hadamard
from composer_jax.quant.scales import mx_exponent

KEY = jax.random.PRNGKey(0)


def _randn(shape, scale=1.0, seed=0):
    return jax.random.normal(jax.random.PRNGKey(seed), shape) * scale


def test_mx_exponent_is_exact_ceil_log2():
    k = np.arange(-100, 100, dtype=np.float64)
    edges = 448.0 * 2.0**k
    amax = np.concatenate([edges, np.nextafter(edges.astype(np.float32), np.inf),
                           np.abs(np.random.default_rng(0).standard_normal(1000)) * 10.0 ** np.random.default_rng(1).integers(-30, 30, 1000)])
    amax = amax.astype(np.float32)
    want = np.clip(np.ceil(np.log2(amax.astype(np.float64) / 448.0)), -127, 127)
    np.testing.assert_array_equal(np.asarray(mx_exponent(jnp.asarray(amax))), want)


def test_mxfp8_matches_numpy_oracle():
    x = np.asarray(_randn((64, 256), 5.0)) * np.exp(np.random.default_rng(2).uniform(-8, 8, (64, 8, 1))).repeat(32, 2).reshape(64, 256)
    x = x.astype(np.float32)
    q = quantize(jnp.asarray(x), "mxfp8")
    xb = x.reshape(64, 8, 32).astype(np.float64)
    scale = 2.0 ** np.ceil(np.log2(np.abs(xb).max(-1, keepdims=True) / 448.0))
    want = np.clip(xb / scale, -448, 448).astype(np.float32).astype(ml_dtypes.float8_e4m3fn)
    np.testing.assert_array_equal(np.asarray(q.data).view(np.uint8), want.reshape(64, 256).view(np.uint8))
    np.testing.assert_array_equal(np.asarray(q.scales.astype(jnp.float32)), scale[..., 0].astype(np.float32))


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_zero_block_gets_smallest_scale_and_no_nan(fmt):
    x = jnp.zeros((2, 64)).at[1, :16].set(3.0)
    q = quantize(x, fmt)
    s = np.asarray(q.scales.astype(jnp.float32))
    assert np.all(np.isfinite(s))
    assert s[0, 0] == (2.0**-127 if fmt == "mxfp8" else 2.0**-9)
    d = np.asarray(dequantize(q))
    assert np.all(np.isfinite(d)) and np.all(d[0] == 0) and np.all(d[1, :16] == 3.0)


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
@pytest.mark.parametrize("big", [465.0, 1e4, 3e38])
def test_huge_values_clip_not_nan(fmt, big):
    x = _randn((4, 64)).at[0, 3].set(big).at[2, 40].set(-big)
    q = quantize(x, fmt)
    d = np.asarray(dequantize(q))
    assert np.all(np.isfinite(d))
    assert abs(d[0, 3] - big) <= 0.25 * big and abs(d[2, 40] + big) <= 0.25 * big


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_subnormal_inputs_give_finite_scales(fmt):
    x = jnp.full((2, 32), 1e-40, jnp.float32).at[1].set(jnp.float32(2.0**-130))
    q = quantize(x, fmt)
    assert np.all(np.isfinite(np.asarray(q.scales.astype(jnp.float32))))
    d = np.asarray(dequantize(q))
    assert np.all(np.isfinite(d)) and np.max(np.abs(d)) <= 1e-37  # flushed (documented)


def test_values_in_e4m3_subnormal_range_within_block():
    x = jnp.zeros((1, 32)).at[0, 0].set(448.0).at[0, 1].set(0.01).at[0, 2].set(-0.0035)
    d = np.asarray(dequantize(quantize(x, "mxfp8")))
    assert abs(d[0, 1] - 0.01) <= 2.0**-10 and abs(d[0, 2] + 0.0035) <= 2.0**-10


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_negatives_are_symmetric(fmt):
    x = _randn((8, 64))
    a, b = dequantize(quantize(x, fmt)), dequantize(quantize(-x, fmt))
    np.testing.assert_array_equal(np.asarray(a), -np.asarray(b))


def test_mxfp8_nonfinite_poisons_only_its_block():
    x = _randn((2, 64)).at[0, 5].set(jnp.nan).at[1, 40].set(jnp.inf)
    q = quantize(x, "mxfp8")
    assert np.all(np.asarray(q.scales.view(jnp.uint8)) == [[255, 127 + int(mx_exponent(jnp.max(jnp.abs(x[0, 32:]))))],
                                                           [127 + int(mx_exponent(jnp.max(jnp.abs(x[1, :32])))), 255]])
    d = np.asarray(dequantize(q))
    assert np.all(np.isnan(d[0, :32])) and np.all(np.isnan(d[1, 32:]))
    assert np.all(np.isfinite(d[0, 32:])) and np.all(np.isfinite(d[1, :32]))


def test_nvfp4_nonfinite_poisons_whole_tensor():
    x = _randn((2, 64)).at[0, 5].set(jnp.nan)
    assert np.all(np.isnan(np.asarray(dequantize(quantize(x, "nvfp4")))))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_mxfp8_error_bound(dtype, axis):
    """|x - deq| <= 2**-4 |x| (3 mantissa bits) or, in E4M3's subnormal range, 2**-10 * scale."""
    x = (_randn((64, 96), 1.0) * jnp.exp(_randn((64, 96), 3.0, seed=1))).astype(dtype)
    q = quantize(x, "mxfp8", axis=axis)
    xf = np.asarray(x.astype(jnp.float32))
    err = np.abs(np.asarray(dequantize(q)) - xf)
    scale = np.repeat(np.asarray(q.scales.astype(jnp.float32)), 32, axis=axis)
    assert np.all(err <= np.maximum(2.0**-4 * np.abs(xf), 2.0**-10 * scale))


@pytest.mark.parametrize("block_2d", [False, True])
def test_nvfp4_error_bound(block_2d):
    """|x - deq| <= (block scale * global) * 1: half the widest E2M1 step (2), scale clipping included."""
    x = _randn((64, 96), 2.0) * jnp.exp(_randn((64, 96), 1.0, seed=1))
    q = quantize(x, "nvfp4", block_2d=block_2d)
    unit = np.asarray(q.scales.astype(jnp.float32)) * float(q.global_scale)
    unit = np.repeat(np.repeat(unit, 16, 1), 16, 0) if block_2d else np.repeat(unit, 16, 1)
    err = np.abs(np.asarray(dequantize(q)) - np.asarray(x))
    assert np.all(err <= unit)
    rel_rms = np.sqrt(np.mean(err**2)) / np.sqrt(np.mean(np.asarray(x) ** 2))
    assert rel_rms < (0.25 if block_2d else 0.12)  # heavy-tailed data; 256 values share a 2-D scale


def test_nvfp4_stochastic_rounding_is_unbiased():
    x = _randn((4, 32))
    keys = jax.random.split(KEY, 400)
    deqs = jax.vmap(lambda k: dequantize(quantize(x, "nvfp4", key=k)))(keys)
    q = quantize(x, "nvfp4")
    unit = np.repeat(np.asarray(q.scales.astype(jnp.float32)), 16, 1) * float(q.global_scale)
    assert np.all(np.abs(np.asarray(deqs) - np.asarray(x)) <= 2 * unit)  # within one full step
    bias = np.abs(np.asarray(deqs.mean(0)) - np.asarray(x))
    assert np.all(bias <= 0.25 * unit)  # 400 samples: std of the mean <= 0.05 unit
    assert not np.array_equal(np.asarray(deqs[0]), np.asarray(deqs[1]))


def test_nvfp4_2d_tiles_same_values_both_ways():
    w = _randn((48, 80))
    a = dequantize(quantize(w, "nvfp4", block_2d=True))
    b = dequantize(quantize(w.T, "nvfp4", block_2d=True))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b).T)


def test_hadamard_is_orthogonal_and_invertible():
    x, y = _randn((32, 48)), _randn((32, 20), seed=3)
    k = jax.random.PRNGKey(7)
    hx, hy = random_hadamard(x, k, axis=0), random_hadamard(y, k, axis=0)
    np.testing.assert_allclose(np.asarray(hx.T @ hy), np.asarray(x.T @ y), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(random_hadamard(hx, k, axis=0, inverse=True)), np.asarray(x), atol=1e-5)
    assert not np.allclose(np.asarray(hx), np.asarray(x))
    assert not np.allclose(np.asarray(hx), np.asarray(random_hadamard(x, jax.random.PRNGKey(8), axis=0)))


@pytest.mark.parametrize("call,match", [
    (lambda: quantize(jnp.ones((4, 32)), "int8"), "unsupported quantization format"),
    (lambda: quantize(jnp.ones((4, 32), jnp.int32), "mxfp8"), "dtype int32"),
    (lambda: quantize(jnp.ones((4, 33)), "mxfp8"), "not a multiple of the block size 32"),
    (lambda: quantize(jnp.ones((4, 24)), "nvfp4"), "not a multiple of the block size 16"),
    (lambda: quantize(jnp.ones((32, 32)), "mxfp8", block_2d=True), "block_2d"),
    (lambda: quantize(jnp.ones((4, 32)), "mxfp8", key=KEY), "stochastic rounding"),
    (lambda: quantize(jnp.ones((4, 32)), "mxfp8", axis=2), "out of range"),
    (lambda: random_hadamard(jnp.ones((4, 24)), KEY), "multiple of 16"),
    (lambda: dequantize(jnp.ones(3)), "QArray"),
])
def test_bad_input_raises_config_error(call, match):
    with pytest.raises(ConfigError, match=match):
        call()
