"""Manual-axis typing for the quantized dots' custom_vjp rules inside `jax.shard_map`.

Inside shard_map every value carries the set of mesh axes it varies over
(`jax.typeof(x).mat.varying` in jax 0.12).
Ordinary autodiff inserts the collectives that this implies (a replicated weight used with
sharded tokens is implicitly broadcast, so its gradient is summed over those axes); a custom_vjp's
backward must do the same by hand and return cotangents typed exactly like its primal inputs.
Outside shard_map every vma is empty and these functions are no-ops.
"""

from __future__ import annotations

import jax
from jax import lax


def vma(x) -> frozenset:
    """The mesh axes x varies over (empty outside shard_map)."""
    mat = getattr(jax.typeof(x), "mat", None)
    return frozenset(getattr(mat, "varying", ()) or ())


def varying_axes(x, axes: tuple[str, ...]) -> tuple[str, ...]:
    """The axes of `axes` that x varies over: a value replicated over an axis already agrees across it."""
    v = vma(x)
    return tuple(a for a in axes if a in v)


def vary_like(x, *refs):
    """x made varying over every axis any of `refs` varies over (values unchanged)."""
    missing = tuple(sorted(frozenset().union(*map(vma, refs)) - vma(x)))
    return lax.pcast(x, missing, to="varying") if missing else x


def match_vma(ct, primal):
    """A cotangent typed like `primal`: summed over the axes where only the cotangent varies (the
    primal was replicated there, each shard holds a partial gradient), made varying where only the
    primal varies."""
    extra = tuple(sorted(vma(ct) - vma(primal)))
    if extra:
        ct = lax.psum(ct, extra)
    return vary_like(ct, primal)
