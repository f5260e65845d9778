"""Blackwell (tcgen05) variant: the scale re-layout, operand preparation and row re-layout on CPU.

The kernel itself cannot run here (no interpret mode for block-scaled tcgen05 MMA in JAX 0.12;
test_lowering.py lowers it for sm_100). These tests swap its launch for a host emulator of the
documented MMA semantics (scales read back through the chunk layout), so everything around the
MMA (padding, transposes, dtype conversion, scale layout, grouped row layout and gather) is
checked against the reference numerics.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from composer_jax.quant import blockwise
from kernel_cases import assert_matmul_matches, gscale, kind, operands
from pallas_kernels import block_matmul_blackwell as bw
from pallas_kernels import grouped_matmul_blackwell as gbw
from pallas_kernels import tile_math


def _x(shape, seed):
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    return jax.random.normal(k1, shape) * jnp.exp(jax.random.normal(k2, shape))


def _layout_by_index(s, kb_multiple, fill):
    """Reference: out[t, c, r, 4q + j] = s[128t + 32q + r, 4c + j], element by element."""
    s = np.asarray(s)
    r, kb = s.shape
    rt, kbp = -(-r // 128), -(-kb // kb_multiple) * kb_multiple
    out = np.full((rt, kbp // 4, 32, 16), fill, s.dtype)
    for t in range(rt):
        for c in range(kbp // 4):
            for rr in range(32):
                for q in range(4):
                    for j in range(4):
                        row, col = 128 * t + 32 * q + rr, 4 * c + j
                        if row < r and col < kb:
                            out[t, c, rr, 4 * q + j] = s[row, col]
    return out


@pytest.mark.parametrize("r,kb,mult", [(200, 12, 4), (128, 4, 4), (37, 3, 16), (1, 1, 4)])
def test_scale_layout_matches_index_formula(r, kb, mult):
    s = jax.random.randint(jax.random.PRNGKey(r), (r, kb), 0, 255).astype(jnp.uint8)
    got = bw.tcgen05_scale_layout(s, mult, fill=127)
    np.testing.assert_array_equal(np.asarray(got), _layout_by_index(s, mult, 127))
    np.testing.assert_array_equal(np.asarray(bw.from_tcgen05_scale_layout(got, r, kb)), np.asarray(s))


def test_scale_layout_keeps_leading_axes():
    s = jax.random.normal(jax.random.PRNGKey(0), (3, 150, 8)).astype(jnp.float8_e4m3fn)
    got = bw.tcgen05_scale_layout(s, 16, fill=1.0)
    assert got.shape == (3, 2, 4, 32, 16) and got.dtype == jnp.float8_e4m3fn
    for g in range(3):
        np.testing.assert_array_equal(np.asarray(got[g]).view(np.uint8),
                                      _layout_by_index(np.asarray(s[g]).view(np.uint8), 16, 0x38))


def test_operands_are_exact():
    """E8M0 bytes keep their bits; NVFP4 data (E2M1 values in E4M3) converts to float4 exactly."""
    plan = bw.make_plan(10, 64, 10, 16, "e4m3")
    grid = jnp.asarray([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.5, -6], jnp.float8_e4m3fn)
    x = jnp.tile(grid, (10, 7))[:, :64]
    d = bw.data_operand(x, 128, plan)
    assert d.dtype == jnp.float4_e2m1fn and d.shape == (128, 256)
    np.testing.assert_array_equal(np.asarray(d[:10, :64].astype(jnp.float32)), np.asarray(x.astype(jnp.float32)))
    mx = bw.make_plan(10, 64, 10, 32, "e8m0")
    b = jnp.arange(20, dtype=jnp.uint8).reshape(10, 2) * 12
    s = bw.scale_operand(b, "e8m0", mx)
    assert s.dtype == jnp.float8_e8m0fnu
    back = bw.from_tcgen05_scale_layout(jax.lax.bitcast_convert_type(s, jnp.uint8), 128, 4)
    np.testing.assert_array_equal(np.asarray(back[:10, :2]), np.asarray(b))
    assert np.all(np.asarray(back[10:]) == 127) and np.all(np.asarray(back[:, 2:]) == 127)  # unit padding


def _decode(chunks, rows, kb, scale_dtype):
    s = bw.from_tcgen05_scale_layout(chunks, rows, kb)
    if scale_dtype == jnp.float8_e8m0fnu:
        return tile_math.e8m0_value(jax.lax.bitcast_convert_type(s, jnp.uint8))
    return s.astype(jnp.float32)


def emulate_launch(a_op, b_op, sa_op, sb_op, plan):
    """Host model of the kernel: per scale block, in K order, acc += (A_blk @ B_blk^T) * sA * sB."""
    (mp, kp), np_ = a_op.shape, b_op.shape[0]
    kb = kp // plan.bs
    sa, sb = _decode(sa_op, mp, kb, plan.scale), _decode(sb_op, np_, kb, plan.scale)
    a = a_op.astype(jnp.float32).reshape(mp, kb, plan.bs)
    b = b_op.astype(jnp.float32).reshape(np_, kb, plan.bs)
    acc = jnp.zeros((mp, np_), jnp.float32)
    for k in range(kb):
        part = jnp.dot(a[:, k], b[:, k].T, precision="highest")
        acc = acc + part * sa[:, k:k + 1] * sb[:, k][None, :]
    return acc


def emulate_grouped_launch(tile_group, x_op, w_op, sx_op, sw_op, plan):
    rows = x_op.shape[0]
    out = np.full((rows, plan.np_), np.nan, np.float32)  # tiles without rows stay unwritten
    tiles = np.asarray(tile_group)
    sx = bw.from_tcgen05_scale_layout(sx_op, rows, plan.kp // plan.bs)
    for t, g in enumerate(tiles):
        if g < 0:
            continue
        sl = slice(t * 128, (t + 1) * 128)
        sx_t = bw.tcgen05_scale_layout(sx[sl], plan.kbs)
        out[sl] = np.asarray(emulate_launch(x_op[sl], w_op[g], sx_t, sw_op[g], plan))
    return jnp.asarray(out)


@pytest.fixture
def emulated(monkeypatch):
    monkeypatch.setattr(bw, "check_target", lambda: None)
    monkeypatch.setattr(bw, "launch", emulate_launch)
    monkeypatch.setattr(gbw, "launch", emulate_grouped_launch)


@pytest.mark.parametrize("fmt,block_2d", [("mxfp8", False), ("nvfp4", True), ("nvfp4", False)])
@pytest.mark.parametrize("m,k,n", [(37, 96, 48), (130, 288, 208), (1, 512, 16)])
def test_matmul_wrapper_matches_reference(emulated, fmt, block_2d, m, k, n):
    qa, qb, ops = operands(_x((m, k), 2), _x((k, n), 3), fmt, 0, block_2d)
    want = blockwise.block_scaled_matmul(qa, qb)
    got = bw.matmul(*ops, gscale(qa, qb), block_size=qa.block_size, scale_kind=kind(fmt), interpret=False)
    assert got.shape == (m, n) and got.dtype == jnp.float32
    assert_matmul_matches(got, want, qa, qb)


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
@pytest.mark.parametrize("sizes", [[10, 0, 33, 20], [130, 0, 5], [0, 0, 0]])
def test_grouped_wrapper_matches_reference(emulated, fmt, sizes):
    m, k, n = 150, 96, 40
    gs = jnp.asarray(sizes, jnp.int32)
    qa, qb, ops = operands(_x((m, k), 4), _x((len(sizes), k, n), 5), fmt, 1)
    want = blockwise.grouped_block_scaled_matmul(qa, qb, gs)
    got = gbw.grouped_matmul(*ops, gs, gscale(qa, qb), block_size=qa.block_size, scale_kind=kind(fmt),
                             interpret=False)
    assert_matmul_matches(got, want, qa, qb, gs)
    assert np.all(np.asarray(got)[int(gs.sum()):] == 0)


@pytest.mark.parametrize("sizes", [[10, 0, 33, 20], [128, 129, 0, 1], [0, 0], [300]])
def test_aligned_rows(sizes):
    m = 310
    gs = jnp.asarray(sizes, jnp.int32)
    dest, tile_group, rows = gbw.aligned_rows(gs, m)
    dest, tile_group = np.asarray(dest), np.asarray(tile_group)
    total = sum(sizes)
    assert rows % 128 == 0 and tile_group.shape == (rows // 128,)
    assert np.all(dest[total:] == rows)                              # rows past the groups: dropped
    assert np.all(np.diff(dest[:total]) > 0)                         # order kept, no collisions
    owner = np.repeat(np.arange(len(sizes)), sizes)
    np.testing.assert_array_equal(tile_group[dest[:total] // 128], owner)  # each row in its group's tile
    used = np.zeros(rows // 128, bool)
    used[dest[:total] // 128] = True
    assert np.all((tile_group >= 0) == used)                         # empty tiles are skipped


def test_no_interpret_mode_and_format_errors():
    a = jnp.zeros((4, 32), jnp.float8_e4m3fn)
    s = jnp.zeros((4, 1), jnp.uint8)
    with pytest.raises(ValueError, match="no interpret mode"):
        bw.matmul(a, s, a.T, s.T, None, block_size=32, scale_kind="e8m0", interpret=True)
    with pytest.raises(ValueError, match="supports"):
        bw.make_plan(4, 32, 4, 32, "e4m3")
    with pytest.raises(ValueError, match="tcgen05 GPU"):  # CPU default target: no tcgen05
        bw.matmul(a, s, a.T, s.T, None, block_size=32, scale_kind="e8m0", interpret=False)


def test_backend_falls_back_when_the_self_check_fails():
    """Off a tcgen05 GPU the self-check cannot pass: a warning and False (the hopper variant)."""
    from composer_jax.quant import backend

    assert backend.kernel_variant() == "portable"  # CPU
    with pytest.warns(UserWarning, match="self-check"):
        assert backend._blackwell_self_check.__wrapped__() is False
