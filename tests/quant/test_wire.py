"""MXFP8 row codec for the expert all-to-all: exact round trip, and the expert matmul's numerics
unchanged when it consumes decoded rows (composer_jax/quant/wire.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from composer_jax.errors import ConfigError
from composer_jax.quant import dequantize, quantized_ragged_dot
from composer_jax.quant.operands import quant
from composer_jax.quant.wire import decode_mxfp8_rows, encode_mxfp8_rows, wire_width


def _rows(r=40, d=72, seed=0):
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    x = jax.random.normal(k1, (r, d)) * jnp.exp(3 * jax.random.normal(k2, (r, d)))
    x = x.at[1].set(0.0)                                   # an all-zero row
    x = x.at[2, :32].set(jnp.linspace(-1, 1, 32) * 2.0**-20)  # tiny block: E4M3 subnormals
    # block max 228 rounds to 224 = 448 / 2: re-quantizing picks the next smaller exponent
    return x.at[3, :32].set(jnp.concatenate([jnp.asarray([228.0, 2.0**-8, -3.0]), jnp.ones(29)]))


def test_round_trip_is_the_mxfp8_dequantization():
    x = _rows()
    b = encode_mxfp8_rows(x)
    assert b.dtype == jnp.uint8 and b.shape == (40, wire_width(72)) == (40, 96 + 3)
    want = dequantize(quant(x, "mxfp8", 1))[:, :72]
    np.testing.assert_array_equal(np.asarray(decode_mxfp8_rows(b, 72)), np.asarray(want))
    assert np.all(np.asarray(decode_mxfp8_rows(jnp.zeros_like(b), 72)) == 0)  # buffer padding
    assert wire_width(7168) == 7392 < 2 * 7168                                 # vs bf16 bytes


def test_requantizing_decoded_rows_gives_the_same_values():
    x = _rows()
    y = decode_mxfp8_rows(encode_mxfp8_rows(x), 72)
    np.testing.assert_array_equal(np.asarray(dequantize(quant(y, "mxfp8", 1))),
                                  np.asarray(dequantize(quant(x, "mxfp8", 1))))


def test_nonfinite_rows_decode_to_nan():
    x = _rows().at[5, 40].set(jnp.inf)
    y = np.asarray(decode_mxfp8_rows(encode_mxfp8_rows(x), 72))
    assert np.all(np.isnan(y[5, 32:64])) and np.all(np.isfinite(np.delete(y, 5, 0)))


def test_expert_matmul_on_decoded_rows():
    """Forward and input gradient unchanged; the weight gradient equal up to E4M3-subnormal terms."""
    x = _rows(50, 64)
    w = jax.random.normal(jax.random.PRNGKey(1), (3, 64, 40)) / 8
    gs = jnp.asarray([20, 0, 25], jnp.int32)
    f = lambda x, w: quantized_ragged_dot(x, w, gs, "mxfp8")  # noqa: E731
    xd = decode_mxfp8_rows(encode_mxfp8_rows(x), 64)
    np.testing.assert_array_equal(np.asarray(f(xd, w)), np.asarray(f(x, w)))
    loss = lambda x, w: jnp.sum(jnp.sin(f(x, w)))  # noqa: E731
    (dx_d, dw_d), (dx, dw) = jax.grad(loss, (0, 1))(xd, w), jax.grad(loss, (0, 1))(x, w)
    np.testing.assert_array_equal(np.asarray(dx_d), np.asarray(dx))
    np.testing.assert_allclose(np.asarray(dw_d), np.asarray(dw), rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(dw))))


@pytest.mark.parametrize("call,match", [
    (lambda: encode_mxfp8_rows(jnp.ones((2, 3, 32))), "rows"),
    (lambda: encode_mxfp8_rows(jnp.ones((2, 32), jnp.int32)), "dtype int32"),
    (lambda: decode_mxfp8_rows(jnp.zeros((2, 33), jnp.uint8), 64), "uint8"),
    (lambda: decode_mxfp8_rows(jnp.zeros((2, 33)), 32), "uint8"),
])
def test_bad_input(call, match):
    with pytest.raises(ConfigError, match=match):
        call()
