"""Helpers shared by the kernel tests: QArrays -> kernel operands."""

import jax.numpy as jnp
from jax import lax

from composer_jax.quant import quantize


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
