"""The one train-step builder: `(state, batch) -> (state, metrics)` for any registered loss.

`make_step_fns` takes the loss as a parameter (a `LossSpec` or its registered name, see
`composer_jax.train.loss_api`; CPT/SFT use "lm", `composer_jax.train.lm_loss`) and keeps the rest
in one place: the batch schema (which fields, their dtypes and logical axes), microbatching
(gradient accumulation over each field's batch axis), the context-parallel reorder, placement on
the mesh, the non-finite guard and the router-bias update. Every loss divides its sums by global
denominators computed on the whole step batch, so microbatched gradients equal full-batch ones.
After the optimizer update, router selection biases move by the aux-loss-free rule from the expert
loads of the whole (global) batch. A non-finite loss or gradient skips the update (parameters and
optimizer state unchanged) and counts it; the loop stops after `max_nonfinite_steps` in a row.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import AxisType

from composer_jax.config import Config
from composer_jax.errors import ConfigError
from composer_jax.model import abstract_model, count_params, init_model
from composer_jax.model import router as router_lib
from composer_jax.model.transformer import Transformer
from composer_jax.parallel import api
from composer_jax.parallel import context_parallel as cp_lib
from composer_jax.parallel.sharding import constrain_like_params, context_from_config, shard
from composer_jax.train.loss_api import LOSS_CHUNK_TOKENS, LossContext, LossSpec, get_loss
from composer_jax.train.optimizers import make_optimizer
from composer_jax.train.placement import Placement
from composer_jax.train.state import TrainState


@dataclasses.dataclass(frozen=True)
class StepFns:
    """The model's static structure and the functions built around it.

    placement: the shardings of the state and batch on a mesh (None: one device, no mesh); the
    jitted steps then take and return state and batches in exactly those shardings.
    """
    graphdef: Any
    abstract_params: Any
    abstract_buffers: Any
    axes: dict
    tx: optax.GradientTransformation
    train_step: Callable
    eval_step: Callable
    placement: Placement | None = None
    param_dtype: Any = jnp.float32      # the forward's parameter dtype (execution.param_dtype)
    master_dtype: Any = jnp.float32     # the TrainState's parameter dtype (see `master_dtype`)
    loss: LossSpec | None = None

    def merge(self, params: dict, buffers: dict) -> Transformer:
        """A model module holding `params` (cast from the master dtype to execution.param_dtype)
        and `buffers` (pure dicts)."""
        return merge_model(self.graphdef, self.abstract_params, self.abstract_buffers,
                           cast_params(params, self.param_dtype), buffers)

    def _jit_out(self, fn, out):
        if self.placement is None:
            return jax.jit(fn)
        return api.jit_with_context(fn, self.placement.pc, out_shardings=out)

    def init_state(self, cfg: Config) -> TrainState:
        """A fresh TrainState (model initialised from `cfg.seed`), created by one jitted function
        directly in its shardings: no host ever holds the whole model. Equal to eager init."""
        def make():
            _, p, b = nnx.split(fresh_model(cfg), nnx.Param, ...)
            return initial_state(nnx.to_pure_dict(p), nnx.to_pure_dict(b), self.tx,
                                 self.master_dtype)
        return self._jit_out(make, self.placement and self.placement.state)()

    def init_opt_state(self, params: dict):
        """Fresh optimizer state for `params`, in the optimizer state's shardings."""
        return self._jit_out(self.tx.init, self.placement and self.placement.state.opt_state)(
            params)

    def place_state(self, state: TrainState) -> TrainState:
        """`state` (host or device arrays) moved into the placement's shardings."""
        return state if self.placement is None else jax.device_put(state, self.placement.state)

    def place_batch(self, batch: dict) -> dict:
        """This host's share of a batch (numpy) as global arrays on the mesh (or as is)."""
        return batch if self.placement is None else self.placement.place_batch(batch)


def merge_model(graphdef, abstract_params, abstract_buffers, params: dict, buffers: dict):
    """Rebuilds the model from pure dicts. replace_by_pure_dict works in place, so it fills fresh
    copies of the state templates, never the shared ones (which would capture tracers)."""
    p = jax.tree.map(lambda x: x, abstract_params)
    b = jax.tree.map(lambda x: x, abstract_buffers)
    nnx.replace_by_pure_dict(p, params)
    nnx.replace_by_pure_dict(b, buffers)
    return nnx.merge(graphdef, p, b)


def fresh_model(cfg: Config) -> Transformer:
    """The model of `cfg` initialised from `cfg.seed` (architecture `cfg.model`, computed as
    `cfg.execution`, normal init std `cfg.train.init_std`)."""
    return init_model(cfg.model, cfg.seed, cfg.execution, cfg.train.init_std)


def master_dtype(cfg: Config) -> jnp.dtype:
    """dtype of the trained parameters in the TrainState: train.master_dtype, else
    execution.param_dtype (the forward always runs in execution.param_dtype)."""
    return jnp.dtype(cfg.train.master_dtype or cfg.execution.param_dtype.value)


def cast_params(params: dict, dtype) -> dict:
    """params with every leaf in `dtype` (leaves already in it are returned as they are)."""
    dtype = jnp.dtype(dtype)
    return jax.tree.map(lambda x: x if x.dtype == dtype else x.astype(dtype), params)


def _axes_and_paths(state):
    is_var = lambda x: isinstance(x, nnx.Variable)  # noqa: E731
    axes = nnx.to_pure_dict(jax.tree.map(lambda v: v.replace(v.get_metadata()["axes"]), state,
                                         is_leaf=is_var))
    flat = nnx.to_flat_state(state)
    paths = {}
    for path, _ in flat:
        node = paths
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = ".".join(str(k) for k in path)
    return axes, paths


def _update_biases(buffers: dict, counts: dict, rate: float) -> dict:
    """Applies the aux-loss-free rule to every router bias from its layers' global counts."""
    buffers = jax.tree.map(lambda x: x, buffers)
    if counts["moe"] is not None:
        b = buffers["moe_layers"]["ffn"]["bias"]
        buffers["moe_layers"]["ffn"]["bias"] = router_lib.update_bias(b, counts["moe"], rate)
    if counts["mtp"] is not None:
        b = buffers["mtp"]["block"]["ffn"]["bias"]
        buffers["mtp"]["block"]["ffn"]["bias"] = router_lib.update_bias(b, counts["mtp"], rate)
    return buffers


def load_max_over_mean(counts: dict) -> jax.Array:
    """max over MoE layers of (max expert load / mean expert load) — 1.0 is perfect balance."""
    vals = []
    for c in counts.values():
        if c is not None:
            c = c.astype(jnp.float32)
            vals.append(jnp.max(c.max(-1) / jnp.maximum(c.mean(-1), 1e-9)))
    return jnp.max(jnp.stack(vals)) if vals else jnp.ones((), jnp.float32)


def _split_micro(x: jax.Array, field, micro: int, pc) -> jax.Array:
    """A field split into microbatches along its batch axis: [..., B, ...] -> [micro, ..., B/micro,
    ...]; under a context every microbatch spans the mesh (sharded by the field's axes)."""
    ax = field.batch_axis
    x = x.reshape(x.shape[:ax] + (micro, x.shape[ax] // micro) + x.shape[ax + 1:])
    if ax:
        x = jnp.moveaxis(x, ax, 0)
    return x if pc is None else shard(x, (None,) + field.axes)


def _accumulate_aux(acc: dict, new: dict, max_keys: tuple[str, ...]) -> dict:
    """Microbatch accumulation of {"loss", "aux", "counts"}: the loss's aux keys in `max_keys`
    take the maximum, everything else is summed."""
    out = jax.tree.map(jnp.add, acc, new)
    if max_keys:
        out["aux"] = dict(out["aux"], **{k: jnp.maximum(acc["aux"][k], new["aux"][k])
                                         for k in max_keys})
    return out


def _aux_identity(shapes: dict, max_keys: tuple[str, ...]) -> dict:
    """The accumulator's start: zeros, and -inf for the max-reduced aux keys."""
    acc = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    if max_keys:
        missing = set(max_keys) - set(acc["aux"])
        if missing:
            raise ValueError(f"LossSpec.max_aux names {sorted(missing)}, which the loss's aux "
                             f"does not return (it returns {sorted(acc['aux'])})")
        acc["aux"] = dict(acc["aux"], **{k: jnp.full(shapes["aux"][k].shape, -jnp.inf,
                                                     shapes["aux"][k].dtype) for k in max_keys})
    return acc


def make_step_fns(graphdef, abstract_params, abstract_buffers, tx, cfg: Config, pc=None,
                  chunk_tokens: int = LOSS_CHUNK_TOKENS, loss: LossSpec | str | None = None):
    """The pure (un-jitted) `train_step(state, batch)` and `eval_step(state, batch)` of `loss`.

    loss: a LossSpec or a registered loss name (`composer_jax.train.loss_api`); None means
    `cfg.train.loss`. The batch holds the fields of `loss.schema` (derived fields are added here).
    pc: a ParallelContext to trace them under (`composer_jax.parallel.api.jit_with_context`), or
    None for one device. Microbatches are split off each field's batch axis and scanned (gradient
    accumulation), so activation memory is that of one microbatch. With train.master_dtype
    float32 the forward runs on a param_dtype copy of the fp32 master weights and microbatch
    gradients accumulate in float32.
    """
    spec = loss if isinstance(loss, LossSpec) else get_loss(loss or cfg.train.loss)
    schema = spec.schema
    micro = cfg.train.microbatches
    rate = cfg.train.router_bias_update_rate
    cp = pc.context_parallel if pc is not None else 1
    param_dtype = jnp.dtype(cfg.execution.param_dtype.value)

    def objective(p, b, mb, denoms, key=None):
        """(loss share, {"aux": aux shares, "counts": expert loads}) of one microbatch. p: the
        master parameters; the forward sees them in param_dtype, gradients come back in the
        master dtype (the cast's transpose)."""
        model = merge_model(graphdef, abstract_params, abstract_buffers,
                            cast_params(p, param_dtype), b)
        inputs = {k: shard(v, schema[k].axes)
                  for k, v in cp_lib.reorder_batch(mb, cp, cfg.model.mtp_depth, schema).items()}
        ctx = LossContext(cfg=cfg, pc=pc, denominators=denoms, key=key, chunk_tokens=chunk_tokens)
        loss_share, aux = spec.fn(model, inputs, ctx)
        return loss_share, {"aux": aux, "counts": ctx.expert_counts()}

    grad_fn = jax.value_and_grad(objective, has_aux=True)

    def train_step(state: TrainState, batch: dict):
        schema.check(batch)
        denoms = spec.denominators(batch)
        split = {k: _split_micro(v, schema[k], micro, pc) for k, v in batch.items()}
        # Randomness (NVFP4 stochastic rounding) derives from (seed, step, microbatch): a resumed
        # run draws exactly the same numbers.
        step_key = jax.random.fold_in(jax.random.key(cfg.seed), state.step)
        mb_keys = jax.random.split(step_key, micro)

        def accumulate(carry, xs):
            mb, key = xs
            key = key if cfg.execution.precision.value == "nvfp4" else None
            (loss, aux), g = grad_fn(state.params, state.buffers, mb, denoms, key)
            g = constrain_like_params(g, abstract_params)
            acc_g, acc = carry
            acc_g = jax.tree.map(jnp.add, acc_g, g)
            acc = _accumulate_aux(acc, {"loss": loss, **aux}, spec.max_aux)
            return (acc_g, acc), None

        if micro == 1:
            # one microbatch: no accumulation loop (a loop carried a zero-initialised gradient
            # the size of the parameters and kept XLA from freeing the backward's buffers
            # before the optimizer update)
            key = mb_keys[0] if cfg.execution.precision.value == "nvfp4" else None
            (loss, aux), grads = grad_fn(state.params, state.buffers,
                                         jax.tree.map(lambda x: x[0], split), denoms, key)
            acc = {"loss": loss, **aux}
        else:
            zeros_g = jax.tree.map(jnp.zeros_like, state.params)
            _, aux_shape = jax.eval_shape(objective, state.params, state.buffers,
                                          jax.tree.map(lambda x: x[0], split), denoms)
            zeros_acc = _aux_identity({"loss": jax.ShapeDtypeStruct((), jnp.float32),
                                       **aux_shape}, spec.max_aux)
            (grads, acc), _ = jax.lax.scan(accumulate, (zeros_g, zeros_acc), (split, mb_keys))
        grads = constrain_like_params(grads, abstract_params)
        grad_norm = optax.global_norm(grads)
        finite = jnp.isfinite(acc["loss"]) & jnp.isfinite(grad_norm)
        updates, new_opt = tx.update(grads, state.opt_state, state.params)
        new_params = optax.apply_updates(state.params, updates)
        new_buffers = _update_biases(state.buffers, acc["counts"], rate)
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)  # noqa: E731
        new_state = TrainState(
            step=state.step + 1,
            params=keep(new_params, state.params),
            buffers=keep(new_buffers, state.buffers),
            opt_state=keep(new_opt, state.opt_state),
            nonfinite_streak=jnp.where(finite, 0, state.nonfinite_streak + 1),
            nonfinite_total=state.nonfinite_total + (~finite).astype(jnp.int32))
        metrics = {"loss": acc["loss"], **spec.metrics(acc["aux"], denoms),
                   "grad_norm": grad_norm,
                   "expert_load_max_over_mean": load_max_over_mean(acc["counts"]),
                   "update_skipped": (~finite).astype(jnp.float32)}
        return new_state, metrics

    def eval_step(state: TrainState, batch: dict):
        schema.check(batch)
        denoms = spec.denominators(batch)
        loss, aux = objective(state.params, state.buffers, batch, denoms)
        if spec.eval_metrics is None:
            return {"loss": loss, **spec.metrics(aux["aux"], denoms)}
        return spec.eval_metrics(aux["aux"], denoms)

    return train_step, eval_step


def initial_state(params: dict, buffers: dict, tx, dtype=None) -> TrainState:
    """TrainState at step 0 for the given parameters (cast to `dtype`, the master dtype, when
    given) and router biases."""
    def zero():   # one buffer per counter: the train step donates them all
        return jnp.zeros((), jnp.int32)
    if dtype is not None:
        params = cast_params(params, dtype)
    return TrainState(step=zero(), params=params, buffers=buffers, opt_state=tx.init(params),
                      nonfinite_streak=zero(), nonfinite_total=zero())


def build_fns(model: Transformer, cfg: Config, mesh=None,
              loss: LossSpec | str | None = None) -> StepFns:
    """Splits `model` (concrete or abstract: `model.abstract_model`), builds the optimizer and the
    jitted train/eval steps of `loss` (a LossSpec or registered name; None: `cfg.train.loss`).
    With `mesh` (a jax Mesh built from `cfg.mesh`) the steps are traced under its
    ParallelContext (rules `cfg.mesh.rules`) with the state and batch shardings of `Placement`
    (the batch's from the loss's schema) as in/out shardings; the state argument is donated."""
    spec = loss if isinstance(loss, LossSpec) else get_loss(loss or cfg.train.loss)
    check_execution(model, cfg)
    graphdef, params_state, buffer_state = nnx.split(model, nnx.Param, ...)
    axes, paths = _axes_and_paths(params_state)
    tx = make_optimizer(cfg.train, axes, paths)
    abstract_params = jax.tree.map(lambda x: x, params_state)
    abstract_buffers = jax.tree.map(lambda x: x, buffer_state)
    pc = None if mesh is None else context_from_config(mesh, cfg.mesh)
    train_step, eval_step = make_step_fns(graphdef, abstract_params, abstract_buffers, tx, cfg, pc,
                                          loss=spec)
    if pc is None:
        placement = None
        train_jit, eval_jit = jax.jit(train_step, donate_argnums=0), jax.jit(eval_step)
    else:
        placement = Placement.build(params_state, buffer_state, tx, cfg, pc, spec.schema,
                                    master_dtype(cfg))
        rep = placement.replicated
        if any(t == AxisType.Explicit for t in mesh.axis_types):
            # sharding in types at the boundary; the step body runs with GSPMD propagation and
            # the rules' constraints (`shard`), as the model's functions do
            train_step = jax.sharding.auto_axes(train_step, out_sharding=(placement.state, rep))
            eval_step = jax.sharding.auto_axes(eval_step, out_sharding=rep)
        train_jit = api.jit_with_context(train_step, pc, in_shardings=(placement.state, None),
                                         out_shardings=(placement.state, rep),
                                         donate_argnums=(0,))
        eval_jit = api.jit_with_context(eval_step, pc, in_shardings=(placement.state, None),
                                        out_shardings=rep)
    return StepFns(graphdef=graphdef, abstract_params=abstract_params,
                   abstract_buffers=abstract_buffers, axes=axes, tx=tx, train_step=train_jit,
                   eval_step=eval_jit, placement=placement,
                   param_dtype=jnp.dtype(cfg.execution.param_dtype.value),
                   master_dtype=master_dtype(cfg), loss=spec)


def check_execution(model: Transformer, cfg: Config) -> None:
    """Raises ConfigError unless `model` was built with `cfg.execution` (the step computes the
    model as its own `execution` says, so the two must agree)."""
    if model.execution != cfg.execution:
        diff = {f.name: (getattr(model.execution, f.name), getattr(cfg.execution, f.name))
                for f in dataclasses.fields(cfg.execution)
                if getattr(model.execution, f.name) != getattr(cfg.execution, f.name)}
        raise ConfigError(f"the model was built with another execution config than cfg.execution "
                          f"(model vs cfg: {diff}); build it with init_model(cfg.model, seed, "
                          f"cfg.execution) or abstract_model(cfg.model, cfg.execution)")


def build(model: Transformer, cfg: Config, mesh=None,
          loss: LossSpec | str | None = None) -> tuple[StepFns, TrainState]:
    """`build_fns` plus the initial TrainState (step 0) holding `model`'s weights (in the master
    dtype), placed on the mesh when there is one."""
    fns = build_fns(model, cfg, mesh, loss)
    _, params_state, buffer_state = nnx.split(model, nnx.Param, ...)
    state = initial_state(nnx.to_pure_dict(params_state), nnx.to_pure_dict(buffer_state), fns.tx,
                          fns.master_dtype)
    return fns, fns.place_state(state)


# A fresh model up to this size (parameters, bytes) in a single-process run is initialised eagerly
# on the host and then placed: compiling the one-program sharded init costs seconds on CPU, which
# dominates small runs and tests. The values are the same either way (tests/train/test_train.py).
EAGER_INIT_MAX_BYTES = 1 << 30


def build_fresh(cfg: Config, mesh=None,
                loss: LossSpec | str | None = None) -> tuple[StepFns, TrainState]:
    """`build_fns` for a freshly initialised model (seed `cfg.seed`) and its TrainState: created
    sharded from the start (`StepFns.init_state`), or for small single-process models eagerly and
    then placed (`build`)."""
    total, _ = count_params(cfg.model)
    if (jax.process_count() == 1
            and total * jnp.dtype(cfg.execution.param_dtype.value).itemsize
            <= EAGER_INIT_MAX_BYTES):
        return build(fresh_model(cfg), cfg, mesh, loss)
    fns = build_fns(abstract_model(cfg.model, cfg.execution), cfg, mesh, loss)
    return fns, fns.init_state(cfg)
