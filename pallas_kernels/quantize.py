"""Fused quantize kernels: per-block amax -> scale -> scale, clip and cast, in one pass over a tile.

Shapes: x [R, C] float (f32/bf16/f16) with blocks along C (contraction axis last). R is padded to
the row tile and C to the column tile (zeros never change a block's scale); outputs are sliced back.
  quantize_mxfp8: data float8_e4m3fn [R, C], E8M0 scale bytes uint8 [R, C/32].
  quantize_nvfp4: E2M1 values stored as float8_e4m3fn [R, C] (exact), E4M3 scales [R, C/16]
    (or [R/16, C/16] for 16x16 tiles); the FP32 global scale is an input (a whole-tensor reduction).
Variants: "portable"/"hopper" use power-of-two column tiles (Triton needs them); "tpu" uses whole
rows so that the scale block's last axis is the full C/block (Mosaic's (8, 128) rule).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels import common, tile_math

MX_BLOCK = 32
NV_BLOCK = 16


def _blocks(x: jax.Array, b: int, two_d: bool) -> jax.Array:
    r, c = x.shape
    if two_d:
        return x.reshape(r // b, b, c // b, b)
    return x.reshape(r, c // b, b)


def _reduce(fn, xb: jax.Array, two_d: bool) -> jax.Array:
    """Per-block reduction, one axis at a time (Triton lowers single-axis reductions only)."""
    if two_d:
        return fn(fn(xb, axis=3, keepdims=True), axis=1, keepdims=True)
    return fn(xb, axis=2, keepdims=True)


def _amax(xb: jax.Array, two_d: bool) -> jax.Array:
    return _reduce(jnp.max, jnp.abs(xb), two_d)


def _finite(xb: jax.Array, two_d: bool) -> jax.Array:
    """Per-block "no NaN/Inf" flag (a min over 0/1 floats: Triton has no boolean reduction)."""
    return _reduce(jnp.min, jnp.where(jnp.isfinite(xb), 1.0, 0.0), two_d) > 0.0


def _mx_kernel(x_ref, data_ref, scale_ref):
    xb = _blocks(x_ref[...].astype(jnp.float32), MX_BLOCK, False)
    amax = _amax(xb, False)
    e = tile_math.mx_exponent(amax)
    finite = _finite(xb, False)
    y = jnp.clip(xb * tile_math.exp2_int(-e), -tile_math.E4M3_MAX, tile_math.E4M3_MAX)
    data_ref[...] = jnp.where(finite, y, jnp.nan).reshape(data_ref.shape).astype(data_ref.dtype)
    byte = jnp.where(finite, e + 127, 255)
    scale_ref[...] = byte.reshape(scale_ref.shape).astype(scale_ref.dtype)


def _nv_kernel(g_ref, x_ref, *rest, two_d: bool, stochastic: bool):
    if stochastic:
        bits_ref, data_ref, scale_ref = rest
    else:
        data_ref, scale_ref = rest
    g = g_ref[0, 0]
    xb = _blocks(x_ref[...].astype(jnp.float32), NV_BLOCK, two_d)
    amax = _amax(xb, two_d)
    s = jnp.clip(amax / (g * jnp.float32(tile_math.E2M1_MAX)), tile_math.NV_SCALE_MIN, tile_math.E4M3_MAX)
    s = jnp.where(_finite(xb, two_d), s, jnp.nan).astype(jnp.float8_e4m3fn)
    v = jnp.clip(xb / (s.astype(jnp.float32) * g), -tile_math.E2M1_MAX, tile_math.E2M1_MAX)
    if stochastic:
        q = tile_math.e2m1_stochastic(v, _blocks(bits_ref[...], NV_BLOCK, two_d))
    else:
        q = tile_math.e2m1_nearest(v)
    data_ref[...] = q.reshape(data_ref.shape).astype(data_ref.dtype)
    scale_ref[...] = s.reshape(scale_ref.shape)


def _tiles(r: int, c: int, block: int, variant: str, two_d: bool) -> tuple[int, int]:
    """(row tile, column tile) for an [r, c] input."""
    row_floor = block if two_d else 8
    if variant == common.TPU:
        rows = 128 if two_d else 32  # 2-D: 128 rows -> 8 scale rows, the (8, 128) tile
        return common.pow2_tile(r, rows, rows), common.round_up(c, 128)
    return common.pow2_tile(r, 32, row_floor), common.pow2_tile(c, 512, max(block, 32))


def _run(kernel, x, extra_in, out_dtypes, block: int, two_d: bool, variant: str, interpret):
    common.check_variant(variant)
    common.check_2d("x", x)
    r, c = x.shape
    if c % block or (two_d and r % block):
        raise ValueError(f"quantize: shape {x.shape} is not a multiple of the block size {block}")
    br, bc = _tiles(r, c, block, variant, two_d)
    rp, cp = common.round_up(r, br), common.round_up(c, bc)
    srow = block if two_d else 1
    args = [common.pad_to(a, (rp, cp)) for a in (x, *extra_in)]
    spec = pl.BlockSpec((br, bc), lambda i, j: (i, j))
    out_shapes = (jax.ShapeDtypeStruct((rp, cp), out_dtypes[0]),
                  jax.ShapeDtypeStruct((rp // srow, cp // block), out_dtypes[1]))
    out_specs = (spec, pl.BlockSpec((br // srow, bc // block), lambda i, j: (i, j)))
    return kernel, args, spec, out_shapes, out_specs, (rp // br, cp // bc), (r, c, srow)


def _unpad(outs, r: int, c: int, srow: int, block: int):
    data, scales = outs
    return data[:r, :c], scales[: r // srow, : c // block]


@functools.partial(jax.jit, static_argnames=("variant", "interpret"))
def quantize_mxfp8(x: jax.Array, *, variant: str = common.PORTABLE, interpret: bool | None = None):
    """Fused MXFP8 quantize of x [R, C] along C -> (data e4m3 [R, C], E8M0 bytes uint8 [R, C/32])."""
    interpret = common.default_interpret() if interpret is None else interpret
    kernel, args, spec, out_shapes, out_specs, grid, (r, c, srow) = _run(
        _mx_kernel, x, (), (jnp.float8_e4m3fn, jnp.uint8), MX_BLOCK, False, variant, interpret)
    outs = pl.pallas_call(kernel, out_shape=out_shapes, grid=grid, in_specs=[spec],
                          out_specs=out_specs, interpret=interpret, name="quantize_mxfp8")(*args)
    return _unpad(outs, r, c, srow, MX_BLOCK)


@functools.partial(jax.jit, static_argnames=("tile_2d", "variant", "interpret"))
def quantize_nvfp4(x: jax.Array, global_scale: jax.Array, bits: jax.Array | None = None, *,
                   tile_2d: bool = False, variant: str = common.PORTABLE, interpret: bool | None = None):
    """Fused NVFP4 quantize of x [R, C] along C (or in 16x16 tiles).

    global_scale: FP32 scalar; bits: optional uint32 [R, C] for stochastic rounding.
    Returns (E2M1 values as float8_e4m3fn [R, C], E4M3 scales [R, C/16] or [R/16, C/16]).
    """
    interpret = common.default_interpret() if interpret is None else interpret
    stochastic = bits is not None
    if stochastic and bits.shape != x.shape:
        raise ValueError(f"bits shape {bits.shape} must equal x shape {x.shape}")
    kernel = functools.partial(_nv_kernel, two_d=tile_2d, stochastic=stochastic)
    kernel, args, spec, out_shapes, out_specs, grid, (r, c, srow) = _run(
        kernel, x, (bits,) if stochastic else (), (jnp.float8_e4m3fn, jnp.float8_e4m3fn),
        NV_BLOCK, tile_2d, variant, interpret)
    g = jnp.asarray(global_scale, jnp.float32).reshape(1, 1)
    g_spec = pl.BlockSpec((1, 1), lambda i, j: (0, 0))
    outs = pl.pallas_call(kernel, out_shape=out_shapes, grid=grid, in_specs=[g_spec] + [spec] * len(args),
                          out_specs=out_specs, interpret=interpret, name="quantize_nvfp4")(g, *args)
    return _unpad(outs, r, c, srow, NV_BLOCK)
