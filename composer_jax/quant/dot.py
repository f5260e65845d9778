"""The quantized dot used by the model: a custom_vjp whose three GEMMs each quantize their inputs
along their own contraction axis, with float32 accumulation.

  forward   y  = Q_K(x) @ Q_K(w)                 (x along K; w along K, or 16x16 tiles for nvfp4)
  input     dx = Q_N(dy) @ Q_N(w)^T              (nvfp4: the forward's own weight tiles)
  weight    dw = Q_M(x)^T @ Q_M(dy)              (nvfp4: 16-point RHT along M on both first)

NVFP4 gradients (dy) are stochastically rounded when a key is given. Glossary: M = prod of x's
leading axes (tokens), K input features, N output features, G experts.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from composer_jax.errors import ConfigError
from composer_jax.quant import backend as be
from composer_jax.quant.formats import DOT_FORMATS, check_input_dtype
from composer_jax.quant.hadamard import random_hadamard
from composer_jax.quant.operands import grad_keys, pad_axes, quant, quant_weight, quant_weight_t
from composer_jax.quant.vma import match_vma


def check_dot_format(fmt: str) -> None:
    if fmt not in DOT_FORMATS:
        raise ConfigError(f"unsupported matmul precision {fmt!r}; valid: {list(DOT_FORMATS)}")


def bf16_dot(x: jax.Array, w: jax.Array, dims) -> jax.Array:
    """Plain bf16 inputs with float32 accumulation (autodiff'd normally)."""
    return lax.dot_general(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), dims,
                           preferred_element_type=jnp.float32)


def weight_grad_operands(x, dy, fmt: str, k_dw, k_rht, block: int, amax_axes: tuple[str, ...] = ()):
    """Q_M(x)^T [K, Mp] and Q_M(dy) [Mp, N] for dw = x^T dy (rows padded to `block`; nvfp4: RHT first).

    amax_axes: mesh axes over which NVFP4 per-tensor scales are reduced (operands.global_scale)."""
    x, dy = pad_axes(x, (0,), block), pad_axes(dy, (0,), block)
    if fmt == "nvfp4":
        x, dy = random_hadamard(x, k_rht, axis=0), random_hadamard(dy, k_rht, axis=0)
    return quant(x.T, fmt, 1, amax_axes=amax_axes), quant(dy, fmt, 0, key=k_dw, amax_axes=amax_axes)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _qdot(x, w, key, fmt, backend):
    return be.matmul(quant(x, fmt, 1), quant_weight(w, fmt), backend)[:, : w.shape[1]]


def _qdot_fwd(x, w, key, fmt, backend):
    return _qdot(x, w, key, fmt, backend), (x, w, key)


def _qdot_bwd(fmt, backend, res, dy):
    x, w, key = res
    k_dx, k_dw, k_rht = grad_keys(key, fmt)
    dx = be.matmul(quant(dy, fmt, 1, key=k_dx), quant_weight_t(w, fmt), backend)[:, : x.shape[1]]
    qxt, qdy = weight_grad_operands(x, dy, fmt, k_dw, k_rht, 16 if fmt == "nvfp4" else 32)
    dw = be.matmul(qxt, qdy, backend)[:, : w.shape[1]]
    return match_vma(dx.astype(x.dtype), x), match_vma(dw.astype(w.dtype), w), None


_qdot.defvjp(_qdot_fwd, _qdot_bwd)


def quantized_matmul(x: jax.Array, w: jax.Array, fmt: str, key: jax.Array | None = None, *,
                     backend: str = "auto") -> jax.Array:
    """x [..., K] @ w [K, N] -> [..., N] (dtype of x) in `fmt` precision, differentiable.

    fmt: "bf16" (bf16 inputs, float32 accumulation), "mxfp8" or "nvfp4" (block-scaled; see
    the module docstring for what each GEMM quantizes). key: PRNG key for NVFP4 stochastic
    rounding of gradients and the RHT signs (None: round to nearest, fixed signs).
    backend: "auto" | "jnp" | "pallas" (see composer_jax.quant.backend).
    K and N need not be multiples of the block size (operands are zero-padded).
    """
    check_dot_format(fmt)
    be.resolve(backend)
    check_input_dtype(x, "x")
    check_input_dtype(w, "w")
    if w.ndim != 2 or x.ndim < 1 or x.shape[-1] != w.shape[0]:
        raise ConfigError(f"quantized_matmul wants x [..., K] and w [K, N], got {x.shape} and {w.shape}")
    if fmt == "bf16":
        return bf16_dot(x, w, (((x.ndim - 1,), (0,)), ((), ()))).astype(x.dtype)
    x2 = x.reshape(-1, x.shape[-1])
    out = _qdot(x2, w, key, fmt, backend)
    return out.reshape(*x.shape[:-1], w.shape[1]).astype(x.dtype)
