"""Helpers shared by the kernel tests: QArrays -> kernel operands."""

import jax.numpy as jnp
import numpy as np
from jax import lax

from composer_jax.quant import blockwise, dequantize, quantize


def kind(fmt):
    return "e8m0" if fmt == "mxfp8" else "e4m3"


def scales(q, rhs=False):
    s = lax.bitcast_convert_type(q.scales, jnp.uint8) if q.fmt == "mxfp8" else q.scales
    return jnp.repeat(s, 16, axis=-1) if rhs and q.is_2d else s


def data(q):
    return q.data.astype(jnp.float8_e4m3fn)


def gscale(qa, qb):
    return None if qa.global_scale is None else qa.global_scale * qb.global_scale


def operands(a, b, fmt, rhs_axis, block_2d=False):
    qa = quantize(a, fmt, axis=-1)
    qb = quantize(b, fmt, block_2d=True) if block_2d else quantize(b, fmt, axis=rhs_axis)
    return qa, qb, (data(qa), scales(qa), data(qb), scales(qb, True))


def assert_matmul_matches(got, want, qa, qb, group_sizes=None):
    """A kernel's block-scaled matmul equals the reference up to the order of its f32 sums.

    got, want [M, N]; qa [M, K]; qb [K, N], or [G, K, N] with group_sizes [G] (row m uses group g(m),
    rows past the groups are 0). XLA fixes no order for a dot's f32 accumulation, and CPUs differ (the
    vector width changes the partial sums), so two programs with the same products may differ in the
    last bits. The bound per element is K * eps32 * (|A| @ |B|)[m, n]: a wrong scale, block, row or
    group moves an element by a sizeable fraction of (|A| @ |B|)[m, n] itself.
    """
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype == np.float32
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    a = np.abs(np.asarray(dequantize(qa), np.float64))
    b = np.abs(np.asarray(dequantize(qb), np.float64))
    if group_sizes is None:
        magnitude = a @ b
    else:
        gid = np.asarray(blockwise.group_ids(group_sizes, a.shape[0]))
        magnitude = np.zeros(want.shape)
        for g in range(b.shape[0]):
            magnitude[gid == g] = a[gid == g] @ b[g]
    bound = a.shape[-1] * np.finfo(np.float32).eps * magnitude
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    bad = np.argwhere(err > bound)
    assert bad.size == 0, (f"{len(bad)} of {got.size} elements differ by more than summation order allows; "
                           f"first {tuple(bad[0])}: got {got[tuple(bad[0])]!r}, want {want[tuple(bad[0])]!r}, "
                           f"bound {bound[tuple(bad[0])]:.3g}")
