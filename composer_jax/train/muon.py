"""Muon for stacked matrices, keeping the stacking axes (layers, experts) intact.

optax.contrib.muon merges every batch axis of a leaf into one before the Newton-Schulz iteration
(e.g. [layers, expert, in, out] -> [layers*expert, in, out]); under GSPMD that reshape of an
expert-sharded axis with an unsharded one loses the expert sharding and materialises the whole
stack on every device. Here each batch axis is mapped with its own jax.vmap (in_axes = out_axes =
that axis), so a sharded stacking axis stays a sharded batch dimension of the batched matmuls; only
a matrix's own reduction / output axes are transposed and reshaped into one 2-D matrix.

Numerically this is optax.contrib.muon (optax 0.2.8) with preconditioning='frobenius', the
default quintic coefficients and steps, Nesterov momentum and `consistent_rms` scaling: the same
operations in the same order, per matrix.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax
from optax.contrib import MuonDimensionNumbers

# Quintic Newton-Schulz coefficients (Keller Jordan's, optax's 'standard' preset) and steps.
NS_COEFFS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5


def _normalize(ndim: int, dims: MuonDimensionNumbers) -> tuple[tuple[int, ...], tuple[int, ...]]:
    red = (dims.reduction_axis,) if isinstance(dims.reduction_axis, int) else dims.reduction_axis
    out = (dims.output_axis,) if isinstance(dims.output_axis, int) else dims.output_axis
    red = tuple(a % ndim for a in red)
    out = tuple(a % ndim for a in out)
    if set(red) & set(out) or not red or not out:
        raise ValueError(f"reduction axes {red} and output axes {out} must be non-empty and "
                         f"disjoint (ndim={ndim})")
    return red, out


def fan_in_out(shape, dims: MuonDimensionNumbers) -> tuple[int, int]:
    """(prod of reduction-axis sizes, prod of output-axis sizes)."""
    red, out = _normalize(len(shape), dims)
    return math.prod(shape[a] for a in red), math.prod(shape[a] for a in out)


def newton_schulz(x: jax.Array, coeffs=NS_COEFFS, steps: int = NS_STEPS,
                  eps: float = 1e-8) -> jax.Array:
    """Approximately orthogonalises one 2-D matrix (Frobenius pre-scaling, quintic iteration)."""
    transposed = x.shape[0] > x.shape[1]
    if transposed:                 # iterate on the wide orientation: X X^T is the smaller Gram
        x = x.T
    x = x / (jnp.linalg.norm(x, ord="fro") + eps)
    c0, c1, c2 = (jnp.asarray(c, x.dtype) for c in coeffs)
    for _ in range(steps):
        a = x @ x.T
        b = c1 * a + c2 * a @ a
        x = c0 * x + b @ x
    return x.T if transposed else x


def orthogonalize(x: jax.Array, dims: MuonDimensionNumbers, coeffs=NS_COEFFS,
                  steps: int = NS_STEPS, eps: float = 1e-8) -> jax.Array:
    """Newton-Schulz per matrix of `x`; every axis not named in `dims` is a batch axis, mapped with
    its own vmap (never merged with another), so shardings of batch axes are preserved."""
    red, out = _normalize(x.ndim, dims)
    batch = tuple(a for a in range(x.ndim) if a not in red and a not in out)
    core = [a for a in range(x.ndim) if a not in batch]          # matrix axes, original order
    red_c = tuple(core.index(a) for a in red)                    # their positions once batch
    out_c = tuple(core.index(a) for a in out)                    # axes are mapped away

    def one(m):                   # one matrix, with only its reduction and output axes
        perm = red_c + out_c
        inv = tuple(sorted(range(m.ndim), key=lambda i: perm[i]))
        t = m.transpose(perm)
        shape = t.shape
        flat = t.reshape(math.prod(shape[:len(red_c)]), math.prod(shape[len(red_c):]))
        return newton_schulz(flat, coeffs, steps, eps).reshape(shape).transpose(inv)

    # Stacks of stacks ([layers, experts, ...]) run their lowest batch axis (layers) as a loop:
    # the f32 Newton-Schulz temporaries then hold one layer's matrices, not every layer's (at 256k
    # on expert8 x context32 that is ~5 GiB per temporary instead of 60x as much at once).
    looped = sorted(batch)[0] if len(batch) >= 2 else None
    f = one
    for a in sorted(batch):      # innermost vmap = lowest axis; the outer ones see higher axes
        if a != looped:
            f = jax.vmap(f, in_axes=a - (looped is not None), out_axes=a - (looped is not None))
    if looped is None:
        return f(x)
    y = jax.lax.map(f, jnp.moveaxis(x, looped, 0))
    return jnp.moveaxis(y, 0, looped)


class MuonState(NamedTuple):
    count: jax.Array   # int32 scalar
    mu: Any            # momentum, like the (masked) params


def _is_spec(x) -> bool:
    return x is None or isinstance(x, MuonDimensionNumbers)


def scale_by_muon(dims_tree, beta: float = 0.95, coeffs=NS_COEFFS, steps: int = NS_STEPS,
                  eps: float = 1e-8, consistent_rms: Optional[float] = None,
                  mu_dtype=None) -> optax.GradientTransformation:
    """Nesterov momentum (bias-corrected as optax does), Newton-Schulz orthogonalisation per
    matrix, then shape scaling: sqrt(max(fan_in, fan_out)) * consistent_rms, or
    sqrt(max(1, fan_out / fan_in)) when consistent_rms is None.

    dims_tree: a MuonDimensionNumbers per leaf, or None for leaves this transformation does not
    see (they are masked out, e.g. by optax.partition, and passed through unchanged)."""

    def per_leaf(fn, *trees):
        return jax.tree.map(lambda d, *xs: xs[0] if d is None else fn(d, *xs), dims_tree, *trees,
                            is_leaf=_is_spec)

    def init_fn(params):
        mu = optax.tree.zeros_like(params, dtype=mu_dtype)
        return MuonState(count=jnp.zeros([], jnp.int32), mu=mu)

    def scale(d, u):
        fi, fo = fan_in_out(u.shape, d)
        if consistent_rms is not None:
            s = jnp.sqrt(jnp.maximum(fi, fo)) * consistent_rms
        else:
            s = jnp.sqrt(jnp.maximum(1, fo / fi))
        return s * u

    def update_fn(updates, state, params=None):
        del params
        mu = optax.tree.update_moment(updates, state.mu, beta, 1)
        count = optax.safe_increment(state.count)
        mu_hat = jax.tree.map(
            lambda m, g: beta * m + (1 - beta) * g,
            optax.tree.bias_correction(mu, beta, optax.safe_increment(count)),
            optax.tree.bias_correction(updates, beta, count))
        new = per_leaf(lambda d, m: scale(d, orthogonalize(m, d, coeffs, steps, eps)), mu_hat)
        return new, MuonState(count=count, mu=optax.tree.cast(mu, mu_dtype))

    return optax.GradientTransformation(init_fn, update_fn)


def muon(learning_rate, dims_tree, beta: float = 0.95, eps: float = 1e-8,
         weight_decay: float = 0.0, weight_decay_mask=None, consistent_rms: Optional[float] = None,
         adam_b1: float = 0.9, adam_b2: float = 0.999, adam_weight_decay: float = 0.0,
         adam_weight_decay_mask=None, mu_dtype=None) -> optax.GradientTransformation:
    """Muon on the leaves with a MuonDimensionNumbers in `dims_tree`, (Nesterov) AdamW on the
    leaves with None — optax.contrib.muon's composition, with the orthogonalisation above.

    adam_weight_decay_mask: None decays every AdamW leaf (what optax.contrib.muon does)."""
    labels = jax.tree.map(lambda d: "adam" if d is None else "muon", dims_tree, is_leaf=_is_spec)
    # Inside optax.partition the Muon branch sees the AdamW leaves as empty MaskedNodes.
    return optax.partition(
        {"muon": optax.chain(
            scale_by_muon(dims_tree, beta=beta, eps=eps, consistent_rms=consistent_rms,
                          mu_dtype=mu_dtype),
            optax.add_decayed_weights(weight_decay, weight_decay_mask),
            optax.scale_by_learning_rate(learning_rate)),
         "adam": optax.adamw(learning_rate, b1=adam_b1, b2=adam_b2, eps=eps,
                             weight_decay=adam_weight_decay, mask=adam_weight_decay_mask,
                             mu_dtype=mu_dtype, nesterov=True)},
        labels)


__all__ = ["MuonState", "NS_COEFFS", "NS_STEPS", "fan_in_out", "muon", "newton_schulz",
           "orthogonalize", "scale_by_muon"]
