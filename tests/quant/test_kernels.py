"""Pallas kernels (interpret mode) equal the reference numerics, every variant: quantization bit for bit,
matmuls up to the order of their f32 sums (kernel_cases.assert_matmul_matches)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk
from composer_jax.quant import blockwise, quantize
from composer_jax.quant.rounding import sr_bits
from kernel_cases import assert_matmul_matches, data, gscale, kind, operands

VARIANTS = ["portable", "hopper", "tpu"]


def _x(shape, seed=0, spread=2.0):
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    return jax.random.normal(k1, shape) * jnp.exp(spread * jax.random.normal(k2, shape))


def _same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype
    np.testing.assert_array_equal(a.view(np.uint8 if a.itemsize == 1 else np.uint32), b.view(np.uint8 if b.itemsize == 1 else np.uint32))


def slow(*args):
    return pytest.param(*args, marks=pytest.mark.slow)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", [(37, 96), slow((1, 32)), slow((64, 544)), slow((9, 1056))])
def test_quantize_mxfp8_kernel_bitexact(variant, shape):
    x = _x(shape).at[0, 0].set(jnp.nan).at[-1, -1].set(1e5)
    q = quantize(x, "mxfp8")
    d, s = pk.quantize_mxfp8(x.astype(jnp.bfloat16).astype(jnp.float32), variant=variant)
    q = quantize(x.astype(jnp.bfloat16).astype(jnp.float32), "mxfp8")
    _same_bits(d, q.data)
    _same_bits(s, jax.lax.bitcast_convert_type(q.scales, jnp.uint8))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape,tile_2d,stochastic", [
    ((37, 80), False, True), ((48, 160), True, False), slow((1, 16), False, False),
    slow((37, 80), False, False), slow((130, 48), False, True)])
def test_quantize_nvfp4_kernel_bitexact(variant, shape, tile_2d, stochastic):
    x = _x(shape, seed=1)
    key = jax.random.PRNGKey(3) if stochastic else None
    q = quantize(x, "nvfp4", block_2d=tile_2d, key=key)
    bits = sr_bits(key, shape) if stochastic else None
    d, s = pk.quantize_nvfp4(x, q.global_scale, bits, tile_2d=tile_2d, variant=variant)
    _same_bits(d, q.data.astype(jnp.float8_e4m3fn))
    _same_bits(s, q.scales)


MM_SHAPES = [(37, 96, 50), slow(1, 32, 1), slow(130, 288, 200), slow(16, 1024, 16)]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("fmt,block_2d", [("mxfp8", False), ("nvfp4", True), slow("nvfp4", False)])
@pytest.mark.parametrize("m,k,n", MM_SHAPES)
def test_block_scaled_matmul_matches_reference(variant, fmt, block_2d, m, k, n):
    if block_2d and n % 16:
        n = n + (-n % 16)  # 2-D weight tiles need N padded to 16 (the dot pads it)
    qa, qb, ops = operands(_x((m, k), 2, 1.0), _x((k, n), 3, 1.0), fmt, 0, block_2d)
    want = blockwise.block_scaled_matmul(qa, qb)
    got = pk.block_scaled_matmul(*ops, gscale(qa, qb), block_size=qa.block_size, scale_kind=kind(fmt), variant=variant)
    assert_matmul_matches(got, want, qa, qb)


GROUPS = [[10, 0, 33, 20], slow([37]), slow([0, 0, 5]), slow([3, 3, 3, 3, 3, 3, 3, 3])]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
@pytest.mark.parametrize("sizes", GROUPS)
def test_grouped_matmul_matches_reference(variant, fmt, sizes):
    m, k, n = 70, 96, 40
    gs = jnp.asarray(sizes, jnp.int32)
    qa, qb, ops = operands(_x((m, k), 4, 1.0), _x((len(sizes), k, n), 5, 1.0), fmt, 1)
    want = blockwise.grouped_block_scaled_matmul(qa, qb, gs)
    got = pk.grouped_block_scaled_matmul(*ops[:2], ops[2], ops[3], gs, gscale(qa, qb),
                                         block_size=qa.block_size, scale_kind=kind(fmt), variant=variant)
    assert_matmul_matches(got, want, qa, qb, gs)
    assert np.all(np.asarray(got)[int(gs.sum()):] == 0)


def test_nan_propagates_through_matmul_kernel():
    a = _x((8, 64), 6).at[2, 40].set(jnp.nan)
    qa, qb, ops = operands(a, _x((64, 16), 7), "mxfp8", 0)
    got = np.asarray(pk.block_scaled_matmul(*ops, block_size=32, scale_kind="e8m0"))
    assert np.all(np.isnan(got[2])) and np.all(np.isfinite(np.delete(got, 2, 0)))


@pytest.mark.parametrize("call,match", [
    (lambda: pk.block_scaled_matmul(jnp.zeros((4, 32)), jnp.zeros((4, 1)), jnp.zeros((30, 8)), jnp.zeros((1, 8)), block_size=32, scale_kind="e8m0"), "contraction"),
    (lambda: pk.block_scaled_matmul(jnp.zeros((4, 40)), jnp.zeros((4, 1)), jnp.zeros((40, 8)), jnp.zeros((1, 8)), block_size=32, scale_kind="e8m0"), "multiple"),
    (lambda: pk.block_scaled_matmul(jnp.zeros((4, 32)), jnp.zeros((4, 2)), jnp.zeros((32, 8)), jnp.zeros((1, 8)), block_size=32, scale_kind="e8m0"), "scale shapes"),
    (lambda: pk.quantize_mxfp8(jnp.zeros((4, 40))), "multiple"),
    (lambda: pk.quantize_mxfp8(jnp.zeros((4, 32)), variant="ampere"), "unknown kernel variant"),
])
def test_kernel_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
