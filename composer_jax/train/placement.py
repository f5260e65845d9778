"""Where the training state and the batches live on a device mesh.

`Placement.build(...)` derives, from the rules table of a ParallelContext, one NamedSharding per
leaf of the TrainState and of the batch:

  params, router biases   the parameter's storage layout (`parallel.sharding.param_spec`)
  optimizer state         a leaf shaped like a parameter (Adam/Muon moments) takes that
                          parameter's sharding; counts and other scalars are replicated
  step, counters          replicated
  batch fields            their logical axes in the loss's batch schema
                          (composer_jax.parallel.batch_schema), e.g. [B,T] -> (batch, seq)

The training loop, the dry-run planner and the parallel benchmark all use it, so what the planner
compiles is what a pod runs. `place_batch` turns each host's share of the global batch (numpy,
[B/hosts, ...]) into one global array with `jax.make_array_from_process_local_data`; on one host
it is a sharded `device_put`.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from composer_jax.errors import ConfigError
from composer_jax.parallel.api import batch_shardings
from composer_jax.parallel.batch_schema import LM_FIELDS, BatchSchema
from composer_jax.parallel.sharding import (ParallelContext, shardings_like_params,
                                            state_shardings)
from composer_jax.train.state import TrainState

def abstract_batch(cfg, schema: BatchSchema = LM_FIELDS, dims: dict | None = None) -> dict:
    """The global train batch as ShapeDtypeStructs, one per fed field of `schema`: `batch` dims
    are data.global_batch_size, `seq` dims data.seq_len, and unnamed (None) dims come from `dims`
    (field name -> tuple of sizes of its None dims, in order); the LM fields' [B,Dm,T] MTP dim is
    Dm = max(mtp_depth, 1) (the pipeline always emits at least one MTP row)."""
    b, t, dm = cfg.data.global_batch_size, cfg.data.seq_len, max(cfg.model.mtp_depth, 1)
    dims = {"mtp_targets": (dm,), "mtp_mask": (dm,), **(dims or {})}
    out = {}
    for name in schema.names(derived=False):
        f = schema[name]
        extra = list(dims.get(name, ()))
        shape = []
        for ax in f.axes:
            if ax == "batch":
                shape.append(b)
            elif ax == "seq":
                shape.append(t)
            elif not extra:
                raise ConfigError(f"abstract_batch: field {name!r} {f.axes} needs the sizes of "
                                  f"its unnamed dims in `dims`")
            else:
                shape.append(extra.pop(0))
        out[name] = jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(f.dtype))
    return out


def check_microbatches(cfg, pc: ParallelContext) -> None:
    """Every microbatch is split over the batch mesh axes: B / microbatches must divide by them."""
    b, micro = cfg.data.global_batch_size, cfg.train.microbatches
    axes = pc.axes_of("batch")
    n = pc.size(*axes)
    if (b // micro) % n:
        raise ConfigError(
            f"data.global_batch_size={b} / train.microbatches={micro} = {b // micro} rows per "
            f"microbatch, not divisible by the batch mesh axes {({a: pc.sizes[a] for a in axes})} "
            f"(product {n}) under rules {pc.rules.name!r}; use a batch size that is a multiple of "
            f"{micro * n}, fewer microbatches, or a mesh with fewer batch shards")


@dataclasses.dataclass(frozen=True)
class Placement:
    """Shardings of the TrainState (`state`, a TrainState of NamedShardings) and of one batch."""
    pc: ParallelContext
    state: TrainState
    batch: dict

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.pc.mesh, P())

    schema: BatchSchema = LM_FIELDS

    @classmethod
    def build(cls, params_state, buffer_state, tx, cfg, pc: ParallelContext,
              schema: BatchSchema = LM_FIELDS, master_dtype=None) -> "Placement":
        """params_state / buffer_state: nnx States (arrays or ShapeDtypeStructs); schema: the
        batch fields of the step's loss; master_dtype: the TrainState's parameter dtype (the
        optimizer state is shaped from parameters in it)."""
        check_microbatches(cfg, pc)
        p_sh = nnx.to_pure_dict(state_shardings(params_state, pc))
        b_sh = nnx.to_pure_dict(state_shardings(buffer_state, pc))
        params = nnx.to_pure_dict(params_state)
        if master_dtype is not None:
            params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, master_dtype), params)
        opt = jax.eval_shape(tx.init, params)
        o_sh = shardings_like_params(opt, params, p_sh, pc.mesh)
        rep = NamedSharding(pc.mesh, P())
        state = TrainState(step=rep, params=p_sh, buffers=b_sh, opt_state=o_sh,
                           nonfinite_streak=rep, nonfinite_total=rep)
        lm = schema.names(derived=False) == LM_FIELDS.names(derived=False)
        batch = batch_shardings(abstract_batch(cfg), pc) if lm else {}
        return cls(pc, state, batch, schema)

    def with_shardings(self, tree, shardings):
        """ShapeDtypeStructs of `tree` carrying `shardings` (for AOT lowering)."""
        return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                            tree, shardings)

    def place_batch(self, batch: dict) -> dict:
        """This host's rows of the global batch (numpy; each field's batch axis holds this host's
        share) -> global arrays on the mesh."""
        out = {}
        for k, v in batch.items():
            v = np.asarray(v)
            sh = self.batch.get(k)
            if sh is None:
                sh = batch_shardings({k: v}, self.pc, self.schema)[k]
            ax = self.schema[k].batch_axis      # hosts hold disjoint rows of the batch axis
            global_shape = v.shape[:ax] + (v.shape[ax] * jax.process_count(),) + v.shape[ax + 1:]
            out[k] = jax.make_array_from_process_local_data(sh, v, global_shape)
        return out
