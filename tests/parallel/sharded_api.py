"""Test scaffolding (moved out of composer_jax.parallel.api): a plain CE loss, forward and logits
of the model under a ParallelContext, an AdamW step, placement helpers. Pure functions of
(graphdef, params, batch); without a context they run on one device, the reference the sharded
runs are compared against. Also re-exports what the tests use from the package's api."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from composer_jax.parallel import context_parallel as cp_lib
from composer_jax.parallel.api import batch_shardings, jit_with_context  # noqa: F401
from composer_jax.parallel.sharding import (ParallelContext, logical_to_spec,  # noqa: F401
                                            state_shardings)


def _explicit(pc: ParallelContext | None) -> bool:
    return pc is not None and any(t == AxisType.Explicit for t in pc.mesh.axis_types)


def model_inputs(batch: dict, cfg, pc: ParallelContext | None) -> dict:
    """The batch as the model sees it: reordered for context parallelism (cp > 1)."""
    cp = pc.context_parallel if pc is not None else 1
    return cp_lib.reorder_batch(batch, cp, cfg.mtp_depth)


def forward(graphdef, params, batch: dict, pc: ParallelContext | None = None):
    """(ModelOutput, model inputs) of the (possibly reordered) batch; params = nnx State."""
    model = nnx.merge(graphdef, params)
    inputs = model_inputs(batch, model.cfg, pc)
    out = model(inputs["tokens"], inputs["positions"], inputs["segment_ids"],
                token_index=inputs["token_index"], mtp_tokens=inputs.get("mtp_tokens"))
    return out, inputs


def _auto_body(fn, pc: ParallelContext | None, out_logical):
    """fn itself, or on an Explicit mesh fn run under `auto_axes` with explicit out shardings."""
    if not _explicit(pc):
        return fn
    spec = logical_to_spec(out_logical, pc.rules, None, pc.sizes)
    return jax.sharding.auto_axes(fn, out_sharding=NamedSharding(pc.mesh, spec))


def logits(graphdef, params, batch, pc=None):
    """[B,T,V] logits in the original token order."""
    def body(params, batch):
        lg = forward(graphdef, params, batch, pc)[0].logits
        cp = pc.context_parallel if pc is not None else 1
        return cp_lib.restore(lg, cp, axis=1) if cp > 1 else lg
    return _auto_body(body, pc, ("batch", "seq", "act_vocab"))(params, batch)


def ce_loss(graphdef, params, batch, pc=None):
    """Mean next-token cross-entropy over loss_mask (MTP heads not included; see train/)."""
    def body(params, batch):
        out, inputs = forward(graphdef, params, batch, pc)
        logp = jax.nn.log_softmax(out.logits.astype(jnp.float32), axis=-1)
        nll = -jnp.take_along_axis(logp, inputs["targets"][..., None], axis=-1)[..., 0]
        mask = inputs["loss_mask"].astype(jnp.float32)
        return jnp.sum(nll * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    return _auto_body(body, pc, ())(params, batch)


def adamw(lr: float = 1e-3) -> optax.GradientTransformation:
    return optax.adamw(lr, b1=0.9, b2=0.95, weight_decay=0.1)


def train_step(graphdef, tx, params, opt_state, batch, pc=None):
    """One AdamW step on the CE loss -> (params, opt_state, loss, grad_norm)."""
    loss, grads = jax.value_and_grad(lambda p: ce_loss(graphdef, p, batch, pc))(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, optax.global_norm(grads)



def place(tree, shardings):
    return jax.device_put(tree, shardings)



def opt_state_shardings(tx, params, param_sharding_tree, pc: ParallelContext):
    """Optimizer-state shardings: every sub-tree shaped like the parameters (Adam moments) takes
    the parameter shardings; everything else (step counts) is replicated."""
    abstract = jax.eval_shape(tx.init, params)
    pdef = jax.tree.structure(params)
    rep = NamedSharding(pc.mesh, P())

    def like_params(x):
        try:
            return jax.tree.structure(x) == pdef
        except Exception:   # noqa: BLE001 - unhashable/odd nodes are simply not param-shaped
            return False

    return jax.tree.map(lambda x: param_sharding_tree if like_params(x) else rep, abstract,
                        is_leaf=like_params)
