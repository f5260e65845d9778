"""Where the training state and the batches live on a device mesh.

`Placement.build(...)` derives, from the rules table of a ParallelContext, one NamedSharding per
leaf of the TrainState and of the batch:

  params, router biases   the parameter's storage layout (`parallel.sharding.param_spec`)
  optimizer state         a leaf shaped like a parameter (Adam/Muon moments) takes that
                          parameter's sharding; counts and other scalars are replicated
  step, counters          replicated
  batch [B,T]             (batch, seq)        batch [B,Dm,T] (MTP fields): (batch, None, seq)

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
from composer_jax.parallel.sharding import (ParallelContext, shardings_like_params,
                                            state_shardings)
from composer_jax.train.state import TrainState

BATCH_FIELDS_2D = ("tokens", "positions", "segment_ids", "targets", "loss_mask")
BATCH_FIELDS_MTP = ("mtp_targets", "mtp_mask")


def abstract_batch(cfg) -> dict:
    """The global train batch as ShapeDtypeStructs: [B,T] token fields, [B,Dm,T] MTP fields
    (Dm = max(mtp_depth, 1): the pipeline always emits at least one MTP row)."""
    b, t, dm = cfg.data.global_batch_size, cfg.data.seq_len, max(cfg.model.mtp_depth, 1)
    batch = {k: jax.ShapeDtypeStruct((b, t), jnp.int32) for k in BATCH_FIELDS_2D}
    batch["loss_mask"] = jax.ShapeDtypeStruct((b, t), jnp.float32)
    batch["mtp_targets"] = jax.ShapeDtypeStruct((b, dm, t), jnp.int32)
    batch["mtp_mask"] = jax.ShapeDtypeStruct((b, dm, t), jnp.float32)
    return batch


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

    @classmethod
    def build(cls, params_state, buffer_state, tx, cfg, pc: ParallelContext) -> "Placement":
        """params_state / buffer_state: nnx States (arrays or ShapeDtypeStructs)."""
        check_microbatches(cfg, pc)
        p_sh = nnx.to_pure_dict(state_shardings(params_state, pc))
        b_sh = nnx.to_pure_dict(state_shardings(buffer_state, pc))
        params = nnx.to_pure_dict(params_state)
        opt = jax.eval_shape(tx.init, params)
        o_sh = shardings_like_params(opt, params, p_sh, pc.mesh)
        rep = NamedSharding(pc.mesh, P())
        state = TrainState(step=rep, params=p_sh, buffers=b_sh, opt_state=o_sh,
                           nonfinite_streak=rep, nonfinite_total=rep)
        return cls(pc, state, batch_shardings(abstract_batch(cfg), pc))

    def with_shardings(self, tree, shardings):
        """ShapeDtypeStructs of `tree` carrying `shardings` (for AOT lowering)."""
        return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                            tree, shardings)

    def place_batch(self, batch: dict) -> dict:
        """This host's rows of the global batch (numpy) -> global arrays on the mesh."""
        out = {}
        for k, v in batch.items():
            sh = self.batch.get(k)
            if sh is None:
                sh = batch_shardings({k: v}, self.pc)[k]
            v = np.asarray(v)
            global_shape = (v.shape[0] * jax.process_count(),) + v.shape[1:]
            out[k] = jax.make_array_from_process_local_data(sh, v, global_shape)
        return out
