"""Small building blocks: parameters with logical axis names, RMSNorm, embedding, SwiGLU MLP.

Every parameter is an `nnx.Param` (or `RouterBias`) carrying `axes`, a tuple of logical axis names
(one per dimension). The parallelism code maps names to mesh axes with one rules table; nothing here
needs a mesh. Modules may be *stacked*: `stack=(L,)` gives every parameter a leading layer axis named
"layers", and the transformer scans over it.

Construction takes the architecture (`ModelConfig`: shapes) and a `ParamInit` (the dtype the
weights are held in and the std of the normal init: execution and training choices, not
architecture). The forward takes a `Ctx`, which carries the `ExecutionConfig` (compute dtype,
precision, remat, dispatch, blocking) to every module at trace time.

Shape glossary: B batch, T tokens, D model dim, F FFN width, V vocab, L stacked layers.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from composer_jax.config import DType, ExecutionConfig, ModelConfig


class RouterBias(nnx.Variable):
    """Per-expert selection bias: updated by the load-balancing rule, never by the optimizer."""


def dtype_of(name) -> jnp.dtype:
    return jnp.dtype(getattr(name, "value", name))


@dataclasses.dataclass(frozen=True)
class ParamInit:
    """How a fresh model's parameters are created: held in `dtype` (execution.param_dtype),
    normal-initialised with `std` (train.init_std)."""
    dtype: DType = DType.FLOAT32
    std: float = 0.02


@dataclasses.dataclass(frozen=True)
class Ctx:
    """What every forward needs besides parameters: the architecture (`cfg`), how to compute
    it (`execution`: compute dtype, precision, remat, dispatch, blocking), whether to compute the
    sequence-wise balance loss, and for the low-precision recipe whether this layer's FFN matmuls
    are quantized and the key that drives NVFP4's stochastic rounding of gradients (None: round
    to nearest)."""
    cfg: ModelConfig
    execution: ExecutionConfig = ExecutionConfig()
    key: jax.Array | None = None
    quantized: bool = True
    balance_loss: bool = False

    @property
    def dtype(self):
        return dtype_of(self.execution.compute_dtype)

    @property
    def fmt(self) -> str:
        """Number format of this layer's FFN/expert matmuls: "bf16", "mxfp8" or "nvfp4"."""
        return self.execution.precision.value if self.quantized else "bf16"

    def subkey(self, tag: int) -> jax.Array | None:
        return None if self.key is None else jax.random.fold_in(self.key, tag)


def make_param(rngs: nnx.Rngs | None, shape: tuple[int, ...], axes: tuple[str | None, ...],
               pinit: ParamInit, stack: tuple[int, ...] = (), init: str = "normal",
               kind=nnx.Param):
    """A parameter of `stack + shape` with logical `axes` ("layers" prepended when stacked).

    init: "normal" (std = pinit.std), "ones", "zeros". nnx.Param leaves are held in pinit.dtype,
    other kinds (router biases) in float32.
    """
    assert len(shape) == len(axes), (shape, axes)
    full = tuple(stack) + tuple(shape)
    dtype = dtype_of(pinit.dtype) if kind is nnx.Param else jnp.float32
    if init == "normal":
        value = pinit.std * jax.random.normal(rngs.params(), full, jnp.float32)
    elif init == "ones":
        value = jnp.ones(full, jnp.float32)
    elif init == "zeros":
        value = jnp.zeros(full, jnp.float32)
    else:
        raise ValueError(f"unknown init {init!r}")
    full_axes = ("layers",) * len(stack) + tuple(axes)
    return kind(value.astype(dtype), axes=full_axes)


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """RMSNorm in float32, returned in x's dtype. x [..., D], weight [D]."""
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (y * weight.astype(jnp.float32)).astype(x.dtype)


def linear(x: jax.Array, w: jax.Array, ctx: Ctx, spec: str = "...d,df->...f") -> jax.Array:
    """A matmul of activations with a weight in the compute dtype, accumulated in float32.

    Every dense/expert matmul of the model goes through here (or `composer_jax.model.moe`'s grouped
    matmul), so the low-precision recipe has one place to hook in.
    """
    dt = ctx.dtype
    y = jnp.einsum(spec, x.astype(dt), w.astype(dt), preferred_element_type=jnp.float32)
    return y.astype(dt)


def ffn_linear(x: jax.Array, w: jax.Array, ctx: Ctx, tag: int) -> jax.Array:
    """x [..., K] @ w [K, N] for FFN weights: in the compute dtype (bf16 recipe), or quantized
    (MXFP8/NVFP4, composer_jax.quant.quantized_matmul: every GEMM of forward and backward quantizes
    along its own contraction axis, FP32 accumulation). `tag` makes each matmul's key distinct."""
    if ctx.fmt == "bf16":
        return linear(x, w, ctx)
    from composer_jax.quant import quantized_matmul
    return quantized_matmul(x.astype(ctx.dtype), w.astype(ctx.dtype), ctx.fmt,
                            key=ctx.subkey(tag)).astype(ctx.dtype)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, cfg: ModelConfig, pinit: ParamInit, stack: tuple[int, ...] = (),
                 axis_name="norm", eps: float | None = None):
        self.weight = make_param(None, (dim,), (axis_name,), pinit, stack, init="ones")
        self.eps = cfg.rms_norm_eps if eps is None else eps

    def __call__(self, x):
        return rms_norm(x, self.weight[...], self.eps)


class MLP(nnx.Module):
    """SwiGLU: down(silu(x @ gate) * (x @ up)). gate/up [D, F], down [F, D]."""

    def __init__(self, cfg: ModelConfig, pinit: ParamInit, width: int, rngs: nnx.Rngs,
                 stack: tuple[int, ...] = ()):
        d = cfg.hidden_size
        self.gate = make_param(rngs, (d, width), ("embed", "mlp"), pinit, stack)
        self.up = make_param(rngs, (d, width), ("embed", "mlp"), pinit, stack)
        self.down = make_param(rngs, (width, d), ("mlp", "embed"), pinit, stack)

    def __call__(self, x, ctx: Ctx):
        h = jax.nn.silu(ffn_linear(x, self.gate[...], ctx, 1)) * ffn_linear(x, self.up[...], ctx, 2)
        return ffn_linear(h, self.down[...], ctx, 3)
