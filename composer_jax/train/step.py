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
import optax
from flax import nnx, struct

from composer_jax.config import Config, MTPLoss
from composer_jax.model import router as router_lib
from composer_jax.model.transformer import Transformer
from composer_jax.train import losses
from composer_jax.train.optimizers import make_optimizer


@struct.dataclass
class TrainState:
    """Everything that changes during training, as plain pytrees (dicts of arrays)."""
    step: jax.Array
    params: dict                # trainable parameters (nnx.Param), pure dict
    buffers: dict               # non-trained state (router selection biases), pure dict
    opt_state: Any
    nonfinite_streak: jax.Array
    nonfinite_total: jax.Array


@dataclasses.dataclass(frozen=True)
class StepFns:
    """The model's static structure and the functions built around it."""
    graphdef: Any
    abstract_params: Any
    abstract_buffers: Any
    axes: dict
    tx: optax.GradientTransformation
    train_step: Callable
    eval_step: Callable

    def merge(self, params: dict, buffers: dict) -> Transformer:
        """A model module holding `params` and `buffers` (pure dicts)."""
        return merge_model(self.graphdef, self.abstract_params, self.abstract_buffers, params,
                           buffers)


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


def _forward_losses(model: Transformer, batch: dict, cfg: Config, denom, mtp_denom, key=None):
    out = model(batch["tokens"], positions=batch["positions"], segment_ids=batch["segment_ids"],
                quant_key=key)
    tc = cfg.train
    ce = losses.cross_entropy_sum(out.logits, batch["targets"], batch["loss_mask"]) / denom
    total = ce
    mtp = jnp.zeros((), jnp.float32)
    if out.mtp_logits is not None:
        if tc.mtp_loss == MTPLoss.SUPERVISED:
            sums = losses.mtp_supervised_sums(out.mtp_logits, batch["mtp_targets"], batch["mtp_mask"])
        else:
            sums = losses.mtp_self_distill_sums(out.mtp_logits, out.logits, batch["mtp_mask"])
        mtp = jnp.mean(sums / mtp_denom)
        total = total + tc.mtp_lambda * mtp
    z = jnp.zeros((), jnp.float32)
    if tc.z_loss > 0:
        z = losses.z_loss_sum(out.logits, batch["loss_mask"]) / denom
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


def build(model: Transformer, cfg: Config) -> tuple[StepFns, TrainState]:
    """Splits `model`, builds the optimizer and the jitted train/eval steps; returns the initial
    TrainState (step 0)."""
    graphdef, params_state, buffer_state = nnx.split(model, nnx.Param, ...)
    axes, paths = _axes_and_paths(params_state)
    tx = make_optimizer(cfg.train, axes, paths)
    params = nnx.to_pure_dict(params_state)
    buffers = nnx.to_pure_dict(buffer_state)
    abstract_params = jax.tree.map(lambda x: x, params_state)
    abstract_buffers = jax.tree.map(lambda x: x, buffer_state)
    micro = cfg.train.microbatches
    rate = cfg.model.router_bias_update_rate

    def loss_fn(p, b, mb, denom, mtp_denom, key=None):
        model = merge_model(graphdef, abstract_params, abstract_buffers, p, b)
        return _forward_losses(model, mb, cfg, denom, mtp_denom, key)

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def train_step(state: TrainState, batch: dict):
        denom = jnp.maximum(batch["loss_mask"].sum(), 1.0)
        mtp_denom = jnp.maximum(batch["mtp_mask"].sum(axis=(0, 2)), 1.0)      # [D]
        split = jax.tree.map(lambda x: x.reshape((micro, x.shape[0] // micro) + x.shape[1:]), batch)

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

    fns = StepFns(graphdef=graphdef, abstract_params=abstract_params,
                  abstract_buffers=abstract_buffers, axes=axes, tx=tx,
                  train_step=jax.jit(train_step, donate_argnums=0), eval_step=jax.jit(eval_step))
    state = TrainState(step=jnp.zeros((), jnp.int32), params=params, buffers=buffers,
                       opt_state=tx.init(params), nonfinite_streak=jnp.zeros((), jnp.int32),
                       nonfinite_total=jnp.zeros((), jnp.int32))
    return fns, state
