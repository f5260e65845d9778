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
import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from composer_jax.config import DType, ExecutionConfig, ModelConfig
from composer_jax.parallel import target
from composer_jax.parallel.sharding import current, compute_cast
from composer_jax.quant import quantized_matmul


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
    """RMSNorm in float32, returned in x's dtype. x [..., D], weight [D]. Under a parallel
    context it is `rms_norm_lean` (same values, a backward that keeps less)."""
    if current() is not None:
        return rms_norm_lean(x, weight, eps)
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (y * weight.astype(jnp.float32)).astype(x.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def rms_norm_lean(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """`rms_norm` whose backward keeps only x (in its own dtype) and the weight: autodiff keeps
    the float32 copy of x and the normalised x as well (two float32 [..., D] buffers per norm).
    The backward recomputes the mean square and the normalised x from x (a reduction and
    elementwise products) and applies autodiff's own terms."""
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (y * weight.astype(jnp.float32)).astype(x.dtype)


def _rms_norm_lean_fwd(x, weight, eps):
    return rms_norm_lean(x, weight, eps), (x, weight)


def _rms_norm_lean_bwd(eps, res, dout):
    x, weight = res
    xf = x.astype(jnp.float32)
    ms = jnp.mean(xf * xf, axis=-1, keepdims=True) + eps
    r = jax.lax.rsqrt(ms)
    y = xf * r
    d = dout.astype(jnp.float32)
    dw = jnp.sum(d * y, axis=tuple(range(d.ndim - 1))).reshape(weight.shape)
    dy = d * weight.astype(jnp.float32)
    dr = jnp.sum(dy * xf, axis=-1, keepdims=True)
    dms = dr * (-0.5 * (r / ms))                       # d rsqrt(m) = -0.5 * rsqrt(m) / m
    t = (dms / x.shape[-1]) * xf                       # the mean's transpose, once per factor
    dxf = dy * r + (t + t)
    return dxf.astype(x.dtype), dw.astype(weight.dtype)


rms_norm_lean.defvjp(_rms_norm_lean_fwd, _rms_norm_lean_bwd)


def _as_matmul(spec: str, x_ndim: int, w_ndim: int) -> tuple[int, int] | None:
    """(number of leading x dims, number of contracted dims) when the einsum `spec` is a plain
    matmul after reshapes, x [P..., C...] @ w [C..., Q...] -> [P..., Q...] (e.g. "...d,df->...f",
    "btc,chd->bthd", "bthv,hvd->btd"); None otherwise."""
    ins, out = spec.replace(" ", "").split("->")
    a, b = ins.split(",")
    ellipsis = a.startswith("...")
    a, out = a.removeprefix("..."), out.removeprefix("...")
    if "." in a + b + out or len(b) != w_ndim:
        return None
    lead = x_ndim - len(a) if ellipsis else 0
    for nc in range(min(len(a), len(b)), 0, -1):
        c = b[:nc]
        if a.endswith(c) and out == a[:-nc] + b[nc:]:
            return lead + len(a) - nc, nc
    return None


@jax.custom_vjp
def cpu_matmul(x2: jax.Array, w2: jax.Array) -> jax.Array:
    """float32 x2 [M, K] @ w2 [K, N] -> [M, N] with a backward laid out for XLA:CPU.

    Autodiff's weight gradient x2^T @ dy contracts the token axis of both operands; XLA:CPU 0.12
    lays that out by writing dy (often a fusion, e.g. the SwiGLU gradient) transposed, [N, M],
    which on the `small` config cost more than the matmul itself. Here the narrower of x2 / dy
    is transposed explicitly from a materialised buffer and the weight gradient is a plain
    row-major matmul. Forward and dx are the same dots as autodiff's."""
    return jnp.dot(x2, w2, preferred_element_type=jnp.float32)


def _cpu_matmul_fwd(x2, w2):
    return cpu_matmul(x2, w2), (x2, w2)


def _cpu_matmul_bwd(res, dy):
    x2, w2 = res
    dx = jnp.dot(dy, w2.T, preferred_element_type=jnp.float32)
    if x2.shape[1] <= w2.shape[1]:          # K <= N: transpose x2 [M, K]
        dw = jnp.dot(jax.lax.optimization_barrier(x2).T, dy, preferred_element_type=jnp.float32)
    else:                                   # transpose dy [M, N], then the small [N, K] result
        dw = jnp.dot(jax.lax.optimization_barrier(dy).T, x2, preferred_element_type=jnp.float32).T
    return dx.astype(x2.dtype), dw.astype(w2.dtype)


cpu_matmul.defvjp(_cpu_matmul_fwd, _cpu_matmul_bwd)


def cpu_without_mesh() -> bool:
    """True on the CPU backend without a parallel context (one device, no mesh): where the CPU
    fast paths (`cpu_matmul`, `attention.attend_cpu`, unrolled layer scans) apply."""
    return target.platform() == "cpu" and current() is None


def use_cpu_matmul(dtype) -> bool:
    """Whether `linear` runs its plain matmuls through `cpu_matmul`: float32 compute where
    `cpu_without_mesh` (as `train.losses.fused_head_ce`)."""
    return jnp.dtype(dtype) == jnp.float32 and cpu_without_mesh()


def save_as(x: jax.Array, name: str) -> jax.Array:
    """x, tagged `name` for the named remat policies (`transformer.REMAT_SAVED`): a policy that
    lists the name keeps x for the backward pass, the others recompute it. Identity otherwise."""
    return checkpoint_name(x, name)


def linear(x: jax.Array, w: jax.Array, ctx: Ctx, spec: str = "...d,df->...f") -> jax.Array:
    """A matmul of activations with a weight in the compute dtype, accumulated in float32.

    Every dense/expert matmul of the model goes through here (or `composer_jax.model.moe`'s grouped
    matmul), so the low-precision recipe has one place to hook in. Plain matmuls (see `_as_matmul`)
    go through `cpu_matmul` where `use_cpu_matmul` says so (same forward, weight gradient laid
    out for XLA:CPU).
    """
    dt = ctx.dtype
    plain = _as_matmul(spec, x.ndim, w.ndim) if use_cpu_matmul(dt) else None
    if plain is not None:
        lead, nc = plain
        k = math.prod(w.shape[:nc])
        y = cpu_matmul(x.astype(dt).reshape(-1, k), w.astype(dt).reshape(k, -1))
        return y.reshape(x.shape[:lead] + w.shape[nc:]).astype(dt)
    # the weight's compute-dtype copy is tagged like the gathered weight (`compute_cast`)
    y = jnp.einsum(spec, x.astype(dt), compute_cast(w, dt),
                   preferred_element_type=jnp.float32)
    return y.astype(dt)


def ffn_linear(x: jax.Array, w: jax.Array, ctx: Ctx, tag: int) -> jax.Array:
    """x [..., K] @ w [K, N] for FFN weights: in the compute dtype (bf16 recipe), or quantized
    (MXFP8/NVFP4, composer_jax.quant.quantized_matmul: every GEMM of forward and backward quantizes
    along its own contraction axis, FP32 accumulation). `tag` makes each matmul's key distinct."""
    if ctx.fmt == "bf16":
        return linear(x, w, ctx)
    return quantized_matmul(x.astype(ctx.dtype), w.astype(ctx.dtype), ctx.fmt,
                            key=ctx.subkey(tag)).astype(ctx.dtype)


@jax.custom_vjp
def swiglu(g: jax.Array, u: jax.Array) -> jax.Array:
    """silu(g) * u, differentiated by hand: the backward keeps only g and u (autodiff keeps
    g, sigmoid(g), 1 - sigmoid(g) and silu(g) as well: four more buffers the size of g) and
    recomputes sigmoid(g) from g (elementwise), then applies autodiff's own terms in its order."""
    return jax.nn.silu(g) * u


def _swiglu_fwd(g, u):
    return swiglu(g, u), (g, u)


def swiglu_backward(res, dh):
    """(dg, du) of `swiglu` from its residuals (g, u) and the output's cotangent dh."""
    g, u = res
    s = jax.nn.sigmoid(g)
    dsilu = dh * u
    # autodiff's own terms of silu(g) = g * sigmoid(g), in its order
    dg = dsilu * s + (dsilu * g) * (s * (1 - s))
    return dg.astype(g.dtype), (dh * (g * s)).astype(u.dtype)


swiglu.defvjp(_swiglu_fwd, swiglu_backward)


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
        if current() is not None:   # the same product, with a backward that keeps only g and u
            h = swiglu(save_as(ffn_linear(x, self.gate[...], ctx, 1), "mlpwi_0"),
                       save_as(ffn_linear(x, self.up[...], ctx, 2), "mlpwi_1"))
        else:
            h = (jax.nn.silu(save_as(ffn_linear(x, self.gate[...], ctx, 1), "mlpwi_0"))
                 * save_as(ffn_linear(x, self.up[...], ctx, 2), "mlpwi_1"))
        return save_as(ffn_linear(h, self.down[...], ctx, 3), "mlpwo")
