"""The pure, jitted pretraining / SFT step: `(state, batch) -> (state, metrics)`.

loss = CE + mtp_lambda * mean_k MTP_k + z_loss * Z + seq_aux_loss_coef * balance, every sum divided
by the batch's total count of valid tokens (so microbatched gradients equal full-batch gradients).
After the optimizer update, router selection biases move by the aux-loss-free rule from the expert
loads of the whole (global) batch. A non-finite loss or gradient skips the update (parameters and
optimizer state unchanged) and counts it; the loop stops after `max_nonfinite_steps` in a row.

Batch fields (B per step, T tokens, D MTP depths): tokens, positions, segment_ids, targets [B,T]
int32; loss_mask [B,T] f32; mtp_targets [B,D,T] int32; mtp_mask [B,D,T] f32.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import AxisType

from composer_jax.config import Config, MTPLoss
from composer_jax.model import abstract_model, count_params, init_model
from composer_jax.model import router as router_lib
from composer_jax.model.transformer import Transformer, lm_logits
from composer_jax.parallel import api
from composer_jax.parallel import context_parallel as cp_lib
from composer_jax.parallel.sharding import compute_value, context_from_config, shard
from composer_jax.train import losses
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

    def merge(self, params: dict, buffers: dict) -> Transformer:
        """A model module holding `params` and `buffers` (pure dicts)."""
        return merge_model(self.graphdef, self.abstract_params, self.abstract_buffers, params,
                           buffers)

    def _jit_out(self, fn, out):
        if self.placement is None:
            return jax.jit(fn)
        return api.jit_with_context(fn, self.placement.pc, out_shardings=out)

    def init_state(self, cfg: Config) -> TrainState:
        """A fresh TrainState (model initialised from `cfg.seed`), created by one jitted function
        directly in its shardings: no host ever holds the whole model. Equal to eager init."""
        def make():
            _, p, b = nnx.split(init_model(cfg.model, cfg.seed), nnx.Param, ...)
            return initial_state(nnx.to_pure_dict(p), nnx.to_pure_dict(b), self.tx)
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


# Per-device tokens per chunk of the LM-head losses (main CE, MTP, z-loss): the [tokens, V]
# float32 logits of a chunk are the largest buffer the losses hold (at V = 163840: 1.3 GB).
LOSS_CHUNK_TOKENS = 2048


def loss_chunks(batch: int, seq: int, pc=None, chunk_tokens: int = LOSS_CHUNK_TOKENS) -> int:
    """How many token chunks the LM-head losses run in: per-device tokens / chunk_tokens, halved
    until every chunk keeps the sequence's split over the context shards (1 = unchunked)."""
    b_shards = pc.size(*pc.axes_of("batch")) if pc is not None else 1
    t_shards = pc.size(*pc.axes_of("seq")) if pc is not None else 1
    per_device = max(batch // b_shards, 1) * max(seq // t_shards, 1)
    n = 1
    while per_device // (2 * n) >= chunk_tokens and seq % (2 * n * t_shards) == 0:
        n *= 2
    return n


def shift_left_original_order(x: jax.Array, k: int, cp: int) -> jax.Array:
    """x [B,T,...] in load-balanced context-parallel order (cp > 1) or plain order: row j gets the
    row of the token k places later *in the original sequence* (zeros past the end).

    In load-balanced order the sequence is 2*cp contiguous chunks of the original, permuted; a
    shift moves rows within each chunk and brings in the first k rows of the next original chunk.
    Only those [B, 2*cp, k, ...] heads travel between shards, never the whole sequence.
    """
    if cp == 1:
        return losses.shift_left(x, k)
    b, t = x.shape[:2]
    n = 2 * cp
    c = t // n
    if k > c:
        raise ValueError(f"shift by {k} exceeds the context-parallel chunk of {c} tokens")
    chunks = cp_lib.load_balance_permutation(n, cp)          # reordered chunk p = original chunk
    where = np.argsort(chunks)                                # original chunk -> reordered slot
    nxt = np.array([where[o + 1] if o + 1 < n else n for o in chunks])
    xc = shard(x.reshape((b, n, c) + x.shape[2:]), ("batch", "seq", None) + (None,) * (x.ndim - 2))
    heads = jnp.concatenate([xc[:, :, :k], jnp.zeros_like(xc[:, :1, :k])], axis=1)
    heads = jnp.take(heads, jnp.asarray(nxt, jnp.int32), axis=1)          # [B, n, k, ...]
    return jnp.concatenate([xc[:, :, k:], heads], axis=2).reshape(x.shape)


# Logical axes of the per-token batch fields (after the context-parallel reorder)
_TOKEN_AXES = {"tokens": ("batch", "seq"), "positions": ("batch", "seq"),
               "segment_ids": ("batch", "seq"), "targets": ("batch", "seq"),
               "loss_mask": ("batch", "seq"), "token_index": ("batch", "seq"),
               "mtp_targets": ("batch", None, "seq"), "mtp_mask": ("batch", None, "seq"),
               "mtp_tokens": (None, "batch", "seq")}


def _forward_losses(model: Transformer, batch: dict, cfg: Config, denom, mtp_denom, key=None,
                    pc=None, chunk_tokens: int = LOSS_CHUNK_TOKENS):
    """Loss terms of one (micro)batch. Under a parallel context with context parallelism the batch
    is reordered first (every loss is a token sum; self-distillation shifts in original order).
    The LM head runs inside the token-chunked losses (`losses.sum_over_token_chunks`)."""
    cp = pc.context_parallel if pc is not None else 1
    inputs = {k: shard(v, _TOKEN_AXES[k]) if k in _TOKEN_AXES else v
              for k, v in cp_lib.reorder_batch(batch, cp, cfg.model.mtp_depth).items()}
    out = model(inputs["tokens"], positions=inputs["positions"],
                segment_ids=inputs["segment_ids"], token_index=inputs["token_index"],
                mtp_tokens=inputs.get("mtp_tokens"), quant_key=key, logits=False)
    tc = cfg.train
    dtype = jnp.dtype(cfg.model.compute_dtype.value)
    w = compute_value(model.lm_head)
    n = loss_chunks(*inputs["tokens"].shape, pc, chunk_tokens)

    def head(h, w):
        return shard(lm_logits(h, w, dtype), ("batch", "seq", "act_vocab"))

    def ce_z(h, targets, mask, w):
        return losses.ce_and_z_sums(head(h, w), targets, mask)

    def distill(h, h_teacher, mask, w):
        return losses.self_distill_sum(head(h, w), head(h_teacher, w), mask)

    ce_sum, z_sum = losses.sum_over_token_chunks(
        ce_z, n, (out.normed, inputs["targets"], inputs["loss_mask"]), (w,))
    ce = ce_sum / denom
    total = ce
    mtp = jnp.zeros((), jnp.float32)
    if out.mtp_normed is not None:
        sums = []
        for d in range(out.mtp_normed.shape[0]):
            mask = inputs["mtp_mask"][:, d]
            if tc.mtp_loss == MTPLoss.SUPERVISED:
                s, _ = losses.sum_over_token_chunks(
                    ce_z, n, (out.mtp_normed[d], inputs["mtp_targets"][:, d], mask), (w,))
            else:   # depth d at i predicts token i+d+2, which the main head predicts at i+d+1
                teacher = shift_left_original_order(out.normed, d + 1, cp)
                s = losses.sum_over_token_chunks(distill, n, (out.mtp_normed[d], teacher, mask),
                                                 (w,))
            sums.append(s)
        mtp = jnp.mean(jnp.stack(sums) / mtp_denom)
        total = total + tc.mtp_lambda * mtp
    z = jnp.zeros((), jnp.float32)
    if tc.z_loss > 0:
        z = z_sum / denom
        total = total + tc.z_loss * z
    if cfg.model.seq_aux_loss_coef > 0:
        total = total + cfg.model.seq_aux_loss_coef * out.balance_loss
    counts = {"moe": out.expert_counts, "mtp": out.mtp_expert_counts}
    return total, {"ce": ce, "mtp": mtp, "z": z, "counts": counts}


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


def make_step_fns(graphdef, abstract_params, abstract_buffers, tx, cfg: Config, pc=None,
                  chunk_tokens: int = LOSS_CHUNK_TOKENS):
    """The pure (un-jitted) `train_step(state, batch)` and `eval_step(state, batch)`.

    pc: a ParallelContext to trace them under (`composer_jax.parallel.api.jit_with_context`), or
    None for one device. Microbatches are split off the batch axis and scanned (gradient
    accumulation), so activation memory is that of one microbatch.
    """
    micro = cfg.train.microbatches
    rate = cfg.model.router_bias_update_rate

    def loss_fn(p, b, mb, denom, mtp_denom, key=None):
        model = merge_model(graphdef, abstract_params, abstract_buffers, p, b)
        return _forward_losses(model, mb, cfg, denom, mtp_denom, key, pc, chunk_tokens)

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def split_micro(x):
        """[B, ...] -> [micro, B/micro, ...]; under a context every microbatch spans the mesh."""
        x = x.reshape((micro, x.shape[0] // micro) + x.shape[1:])
        if pc is None:
            return x
        return shard(x, (None, "batch") + (None,) * (x.ndim - 3) + ("seq",))

    def train_step(state: TrainState, batch: dict):
        denom = jnp.maximum(batch["loss_mask"].sum(), 1.0)
        mtp_denom = jnp.maximum(batch["mtp_mask"].sum(axis=(0, 2)), 1.0)      # [D]
        split = jax.tree.map(split_micro, batch)
        # Randomness (NVFP4 stochastic rounding) derives from (seed, step, microbatch): a resumed
        # run draws exactly the same numbers.
        step_key = jax.random.fold_in(jax.random.key(cfg.seed), state.step)
        mb_keys = jax.random.split(step_key, micro)

        def accumulate(carry, xs):
            mb, key = xs
            key = key if cfg.model.precision.value == "nvfp4" else None
            (loss, aux), g = grad_fn(state.params, state.buffers, mb, denom, mtp_denom, key)
            acc_g, acc = carry
            acc_g = jax.tree.map(jnp.add, acc_g, g)
            acc = jax.tree.map(jnp.add, acc, {"loss": loss, "ce": aux["ce"], "mtp": aux["mtp"],
                                              "z": aux["z"], "counts": aux["counts"]})
            return (acc_g, acc), None

        zeros_g = jax.tree.map(jnp.zeros_like, state.params)
        _, aux_shape = jax.eval_shape(loss_fn, state.params, state.buffers,
                                      jax.tree.map(lambda x: x[0], split), denom, mtp_denom)
        zeros_acc = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                                 {"loss": jax.ShapeDtypeStruct((), jnp.float32), **aux_shape})
        (grads, acc), _ = jax.lax.scan(accumulate, (zeros_g, zeros_acc), (split, mb_keys))
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
        metrics = {"loss": acc["loss"], "ce_loss": acc["ce"], "mtp_loss": acc["mtp"],
                   "z_loss": acc["z"], "grad_norm": grad_norm,
                   "expert_load_max_over_mean": load_max_over_mean(acc["counts"]),
                   "tokens": denom, "update_skipped": (~finite).astype(jnp.float32)}
        return new_state, metrics

    def eval_step(state: TrainState, batch: dict):
        denom = jnp.maximum(batch["loss_mask"].sum(), 1.0)
        mtp_denom = jnp.maximum(batch["mtp_mask"].sum(axis=(0, 2)), 1.0)
        _, aux = loss_fn(state.params, state.buffers, batch, denom, mtp_denom)
        return {"ce_sum": aux["ce"] * denom, "tokens": denom, "mtp": aux["mtp"]}

    return train_step, eval_step


def initial_state(params: dict, buffers: dict, tx) -> TrainState:
    """TrainState at step 0 for the given parameters and router biases."""
    def zero():   # one buffer per counter: the train step donates them all
        return jnp.zeros((), jnp.int32)
    return TrainState(step=zero(), params=params, buffers=buffers, opt_state=tx.init(params),
                      nonfinite_streak=zero(), nonfinite_total=zero())


def build_fns(model: Transformer, cfg: Config, mesh=None) -> StepFns:
    """Splits `model` (concrete or abstract: `model.abstract_model`), builds the optimizer and the
    jitted train/eval steps. With `mesh` (a jax Mesh built from `cfg.mesh`) the steps are traced
    under its ParallelContext (rules `cfg.mesh.rules`) with the state and batch shardings of
    `Placement` as in/out shardings; the state argument is donated."""
    graphdef, params_state, buffer_state = nnx.split(model, nnx.Param, ...)
    axes, paths = _axes_and_paths(params_state)
    tx = make_optimizer(cfg.train, axes, paths)
    abstract_params = jax.tree.map(lambda x: x, params_state)
    abstract_buffers = jax.tree.map(lambda x: x, buffer_state)
    pc = None if mesh is None else context_from_config(mesh, cfg.mesh)
    train_step, eval_step = make_step_fns(graphdef, abstract_params, abstract_buffers, tx, cfg, pc)
    if pc is None:
        placement = None
        train_jit, eval_jit = jax.jit(train_step, donate_argnums=0), jax.jit(eval_step)
    else:
        placement = Placement.build(params_state, buffer_state, tx, cfg, pc)
        rep = placement.replicated
        if any(t == AxisType.Explicit for t in mesh.axis_types):
            # sharding in types at the boundary; the step body runs with GSPMD propagation and
            # the rules' constraints (`shard`), as the model's functions do (parallel/api.py)
            train_step = jax.sharding.auto_axes(train_step, out_sharding=(placement.state, rep))
            eval_step = jax.sharding.auto_axes(eval_step, out_sharding=rep)
        train_jit = api.jit_with_context(train_step, pc, in_shardings=(placement.state, None),
                                         out_shardings=(placement.state, rep),
                                         donate_argnums=(0,))
        eval_jit = api.jit_with_context(eval_step, pc, in_shardings=(placement.state, None),
                                        out_shardings=rep)
    return StepFns(graphdef=graphdef, abstract_params=abstract_params,
                   abstract_buffers=abstract_buffers, axes=axes, tx=tx, train_step=train_jit,
                   eval_step=eval_jit, placement=placement)


def build(model: Transformer, cfg: Config, mesh=None) -> tuple[StepFns, TrainState]:
    """`build_fns` plus the initial TrainState (step 0) holding `model`'s weights, placed on the
    mesh when there is one."""
    fns = build_fns(model, cfg, mesh)
    _, params_state, buffer_state = nnx.split(model, nnx.Param, ...)
    state = initial_state(nnx.to_pure_dict(params_state), nnx.to_pure_dict(buffer_state), fns.tx)
    return fns, fns.place_state(state)


# A fresh model up to this size (parameters, bytes) in a single-process run is initialised eagerly
# on the host and then placed: compiling the one-program sharded init costs seconds on CPU, which
# dominates small runs and tests. The values are the same either way (tests/train/test_train.py).
EAGER_INIT_MAX_BYTES = 1 << 30


def build_fresh(cfg: Config, mesh=None) -> tuple[StepFns, TrainState]:
    """`build_fns` for a freshly initialised model (seed `cfg.seed`) and its TrainState: created
    sharded from the start (`StepFns.init_state`), or for small single-process models eagerly and
    then placed (`build`)."""
    total, _ = count_params(cfg.model)
    if (jax.process_count() == 1
            and total * jnp.dtype(cfg.model.param_dtype.value).itemsize <= EAGER_INIT_MAX_BYTES):
        return build(init_model(cfg.model, cfg.seed), cfg, mesh)
    fns = build_fns(abstract_model(cfg.model), cfg, mesh)
    return fns, fns.init_state(cfg)
