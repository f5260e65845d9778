"""jit under a ParallelContext, and the shardings of batch fields.

`jit_with_context` traces a function with the parallel context active (so `shard` and the model's
rules apply) and runs it under the context's mesh; `batch_shardings` places batch fields by their
logical axes in the batch schema (`composer_jax.parallel.batch_schema`).

Explicit meshes: parameters and batch carry explicit shardings at the boundary; a body runs under
`jax.sharding.auto_axes` (GSPMD inside), where `shard` applies sharding constraints.
"""
from __future__ import annotations

import jax
from jax.sharding import NamedSharding

from composer_jax.parallel.batch_schema import LM_FIELDS, BatchSchema
from composer_jax.parallel.sharding import ParallelContext, activate, logical_to_spec


def batch_shardings(batch: dict, pc: ParallelContext, schema: BatchSchema = LM_FIELDS) -> dict:
    """NamedSharding per batch field (arrays or ShapeDtypeStructs) from the field's logical axes
    in `schema` (e.g. [B,T] tokens -> (batch, seq), [Lm,B,T,K] router replay ->
    (None, batch, seq, None)). A ConfigError names the field, the dim and the mesh axes when a
    dim does not split over them, or the field when the schema does not declare it."""
    return {k: NamedSharding(pc.mesh, logical_to_spec(
        schema[k].axes, pc.rules, v.shape, pc.sizes, what=f"batch field {k!r}"))
        for k, v in batch.items()}


def jit_with_context(fn, pc: ParallelContext, in_shardings=None, out_shardings=None, **kw):
    """jit(fn) traced with `pc` active (a fresh jit per context, so rules never go stale)."""
    def traced(*args):
        with activate(pc):
            return fn(*args)
    jitted = jax.jit(traced, in_shardings=in_shardings, out_shardings=out_shardings, **kw)

    def call(*args):
        with jax.set_mesh(pc.mesh):
            return jitted(*args)
    call.jitted = jitted
    return call
