"""Quantized ragged (grouped, per-expert) dot: jax.lax.ragged_dot semantics as a custom_vjp.

  forward  y[rows of g]  = Q_K(x) @ Q_K(w[g])
  input    dx[rows of g] = Q_N(dy) @ Q_N(w[g])^T      (nvfp4: the forward's own 16x16 tiles)
  weight   dw[g] = Q_M(x_g)^T @ Q_M(dy_g)            (rows re-laid out so each group starts at a
                                                      block boundary; nvfp4: RHT along M first)

Glossary: M token rows sorted by expert, K, N features, G experts, group_sizes [G].
The weight-gradient GEMM always runs on the jnp path (dequantize + ragged transpose in float32):
there is no transposed grouped kernel yet.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from composer_jax.errors import ConfigError
from composer_jax.quant import backend as be
from composer_jax.quant.grouped import grouped_matmul
from composer_jax.quant.dot import check_dot_format, weight_grad_operands
from composer_jax.quant.formats import check_input_dtype
from composer_jax.quant.operands import aligned_layout, grad_keys, quant, quant_weight, quant_weight_t, scatter_rows
from composer_jax.quant.quantize import dequantize
from composer_jax.quant.vma import match_vma, vary_like


def _block(fmt: str) -> int:
    return 16 if fmt == "nvfp4" else 32


def ragged_weight_grad(qxt, qdy, padded_sizes, g: int, k: int, n: int) -> jax.Array:
    """dw [G, K, N] from group-aligned Q_M(x)^T [K, Mp] and Q_M(dy) [Mp, N] (float32).

    Inside shard_map the result varies over every axis xt or dy varies over (a per-shard partial)."""
    xt, dy = dequantize(qxt), dequantize(qdy)
    zeros = vary_like(jnp.zeros((g, xt.shape[0], dy.shape[1]), jnp.float32), xt, dy)
    fwd = lambda w: grouped_matmul(xt.T, w, padded_sizes, precision=lax.Precision.HIGHEST,  # noqa: E731
                                   preferred_element_type=jnp.float32)
    (dw,) = jax.vjp(fwd, zeros)[1](dy)
    return dw[:, :k, :n]


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _qragged(x, w, group_sizes, key, fmt, backend, amax_axes):
    return be.ragged_matmul(quant(x, fmt, 1, amax_axes=amax_axes), quant_weight(w, fmt, amax_axes),
                            group_sizes, backend)[:, : w.shape[2]]


def _qragged_fwd(x, w, group_sizes, key, fmt, backend, amax_axes):
    return _qragged(x, w, group_sizes, key, fmt, backend, amax_axes), (x, w, group_sizes, key)


def _qragged_bwd(fmt, backend, amax_axes, res, dy):
    x, w, group_sizes, key = res
    k_dx, k_dw, k_rht = grad_keys(key, fmt)
    g, k, n = w.shape
    dx = be.ragged_matmul(quant(dy, fmt, 1, key=k_dx, amax_axes=amax_axes),
                          quant_weight_t(w, fmt, amax_axes), group_sizes, backend)[:, :k]
    dest, padded, size = aligned_layout(group_sizes, x.shape[0], _block(fmt))
    qxt, qdy = weight_grad_operands(scatter_rows(x, dest, size), scatter_rows(dy, dest, size),
                                    fmt, k_dw, k_rht, _block(fmt), amax_axes)
    dw = ragged_weight_grad(qxt, qdy, padded, g, k, n)
    return match_vma(dx.astype(x.dtype), x), match_vma(dw.astype(w.dtype), w), None, None


_qragged.defvjp(_qragged_fwd, _qragged_bwd)


def quantized_ragged_dot(x: jax.Array, w: jax.Array, group_sizes: jax.Array, fmt: str,
                         key: jax.Array | None = None, *, backend: str = "auto",
                         amax_axes: tuple[str, ...] = ()) -> jax.Array:
    """Grouped x [M, K] @ w [G, K, N] -> [M, N] (dtype of x), same semantics as jax.lax.ragged_dot.

    Rows are consecutive per group (group_sizes [G] integers); rows past sum(group_sizes) give 0.
    fmt / key / backend as in quantized_matmul.
    amax_axes: inside shard_map, the mesh axes that x, w and the gradients are split over; NVFP4
    per-tensor scales are then reduced (max) over them so every shard quantizes with the scale of
    the whole tensor, as the unsharded call would (expert parallelism). Ignored for mxfp8/bf16.
    """
    check_dot_format(fmt)
    be.resolve(backend)
    check_input_dtype(x, "x")
    check_input_dtype(w, "w")
    if x.ndim != 2 or w.ndim != 3 or x.shape[1] != w.shape[1] or group_sizes.shape != (w.shape[0],):
        raise ConfigError(f"quantized_ragged_dot wants x [M, K], w [G, K, N], group_sizes [G]; got "
                          f"{x.shape}, {w.shape}, {group_sizes.shape}")
    if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
        raise ConfigError(f"group_sizes must be integers, got {group_sizes.dtype}")
    if fmt == "bf16":
        return grouped_matmul(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), group_sizes,
                              preferred_element_type=jnp.float32).astype(x.dtype)
    return _qragged(x, w, group_sizes.astype(jnp.int32), key, fmt, backend, tuple(amax_axes)).astype(x.dtype)
