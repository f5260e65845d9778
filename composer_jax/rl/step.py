"""The pure RL update step `rl_step(state, batch) -> (state, metrics)`, built with the train-step
builder (`composer_jax.train.step.make_step_fns`) and two registered losses:

  "rl_policy"   the policy-gradient loss (`objectives.policy_loss`) on the batch's sampled tokens,
                logp_old = the trainer's log-probs before the update (stop-gradient of this pass),
                all log-probs those of logits / rl.temperature (the sampling distribution),
                entropy and sampler-mismatch metrics; router replay through `ctx.forward`.
  "rl_seq_logp" sum over sampled tokens of the log-probs, per row (the k1 KL pre-pass).

One step: (1) with rl.kl_coef = beta > 0, the current and the frozen reference policy score the
batch (`rl_seq_logp`), k1 = their difference per row, summed over an episode's segments; the
reward becomes R - beta * k1 (k1 in the reward, not in the loss); with beta = 0 no reference
exists and this pass is skipped; (2) Dr.GRPO advantages per row (episodes weighted once by
`sample_weight`); (3) the builder's train step with the "rl_policy" loss (microbatches, chunked LM
head, router-bias update, non-finite guard); (4) metrics.

Batch: `composer_jax.rl.batch.make_batch` (fields and shapes there). With rl.router_replay false
(or a model without MoE layers: `rl.batch.replays_routers`) the `router_replay` field is ignored
and the trainer routes afresh. logp_old is the stop-gradient
of this step's own forward (one update per batch, so PPO's ratio is 1 and ppo_clip equals
truncated_is) unless the batch carries a `logp_old` field (several updates on one batch). The MTP
modules are not run: RL trains the main head.

Metrics: loss, grad_norm, update_skipped, expert_load_max_over_mean, reward_mean, resolved_rate,
kl_k1 (beta > 0 only: mean per episode), is_weight_mean, is_weight_max (over the whole batch: the
builder max-reduces it over microbatches, `LossSpec.max_aux`), is_truncated_frac, clip_frac, entropy (mean per sampled
token), mismatch_abs (mean |logp_old - behaviour_logp|), mismatch_k3 (mean k3 estimate of
KL(sampler || trainer)), advantage_abs_mean, tokens.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import AxisType

from composer_jax.config import Config
from composer_jax.parallel import api
from composer_jax.parallel.batch_schema import LM_FIELDS, ROUTER_REPLAY_FIELDS, BatchSchema, Field
from composer_jax.parallel.sharding import context_from_config
from composer_jax.rl import objectives
from composer_jax.rl.batch import replays_routers
from composer_jax.train.loss_api import LossSpec, register_loss
from composer_jax.train.state import TrainState
from composer_jax.train.step import StepFns, build, make_step_fns

_TOK = ("batch", "seq")
_ROW = ("batch",)

RL_FIELDS = BatchSchema({k: LM_FIELDS[k] for k in (
    "tokens", "positions", "segment_ids", "targets", "loss_mask", "token_index", "mtp_tokens")}
).extend({
    "behaviour_logp": Field("float32", _TOK, doc="the sampler's log-prob of the target token"),
    "logp_old": Field("float32", _TOK, doc="optional: the trainer's log-prob before the first of "
                                           "several updates on this batch (ppo_clip reuse)"),
    "advantages": Field("float32", _ROW, doc="Dr.GRPO advantage of the row (set by rl_step)"),
    "rewards": Field("float32", _ROW, doc="episode reward of the row"),
    "resolved": Field("float32", _ROW, doc="1 when the episode resolved its task"),
    "sample_weight": Field("float32", _ROW, doc="1/segments of the episode; 0 on padding rows"),
    "group_ids": Field("int32", _ROW, doc="task group (advantage baseline) of the row"),
    "episode_ids": Field("int32", _ROW, doc="episode of the row (segments share its reward)"),
}).extend({"router_replay": ROUTER_REPLAY_FIELDS["router_replay"]})

_SEQ_FIELDS = ("tokens", "positions", "segment_ids", "targets", "loss_mask", "router_replay")


def _target_logp_entropy(model, batch, ctx):
    """Per-token (logp [B,T], entropy [B,T]) of the targets under the sampling policy, LM head in
    token chunks. Training episodes are sampled at rl.temperature and `behaviour_logp` is that
    distribution's log-prob, so the trainer scores logits / rl.temperature too: the importance
    ratio compares one distribution, and the gradient is that of the policy that samples."""
    out = ctx.forward(model, batch, with_mtp=False)
    inv_temperature = 1.0 / ctx.cfg.rl.temperature

    def fn(h, tgt, w):
        return objectives.token_logprobs(ctx.logits(h, w) * inv_temperature, tgt)
    return ctx.chunked_map(fn, (out.normed, batch["targets"]), (ctx.lm_head(model),))


def _policy_fn(model, batch, ctx):
    rl = ctx.cfg.rl
    logp, entropy = _target_logp_entropy(model, batch, ctx)
    mask = batch["loss_mask"]
    logp_old = batch["logp_old"] if "logp_old" in batch else jax.lax.stop_gradient(logp)
    loss, m = objectives.policy_loss(
        logp, logp_old, batch["behaviour_logp"], batch["advantages"], mask,
        kind=rl.loss.value, is_truncation=rl.is_truncation, clip_eps=rl.clip_eps,
        normalizer=rl.loss_normalizer)
    m = dict(m, entropy_sum=jnp.sum(mask * jax.lax.stop_gradient(entropy)))
    return loss, m


def _policy_denominators(batch):
    w = batch["sample_weight"]
    episodes = jnp.maximum(w.sum(), 1e-9)
    return {"tokens": jnp.maximum(batch["loss_mask"].sum(), 1.0),
            "reward_mean": jnp.sum(w * batch["rewards"]) / episodes,
            "resolved_rate": jnp.sum(w * batch["resolved"]) / episodes,
            "advantage_abs_mean": jnp.sum(w * jnp.abs(batch["advantages"])) / episodes}


def _policy_metrics(aux, denoms):
    n = denoms["tokens"]
    return {"reward_mean": denoms["reward_mean"], "resolved_rate": denoms["resolved_rate"],
            "advantage_abs_mean": denoms["advantage_abs_mean"], "tokens": aux["tokens"],
            "is_weight_mean": aux["is_weight_sum"] / n,
            "is_weight_max": aux["is_weight_max"],
            "is_truncated_frac": aux["is_truncated"] / n, "clip_frac": aux["clipped"] / n,
            "entropy": aux["entropy_sum"] / n, "mismatch_abs": aux["mismatch_abs_sum"] / n,
            "mismatch_k3": aux["mismatch_k3_sum"] / n}


def _seq_logp_fn(model, batch, ctx):
    logp, _ = _target_logp_entropy(model, batch, ctx)
    return jnp.zeros((), jnp.float32), {"seq_logp": jnp.sum(batch["loss_mask"] * logp, axis=-1)}


RL_POLICY_LOSS = register_loss(LossSpec(
    name="rl_policy", fn=_policy_fn, denominators=_policy_denominators, schema=RL_FIELDS,
    metrics=_policy_metrics, max_aux=("is_weight_max",),
    doc="policy gradient with truncated IS (or PPO clip), constant normalizer; composer_jax.rl"))
RL_SEQ_LOGP = register_loss(LossSpec(
    name="rl_seq_logp", fn=_seq_logp_fn,
    denominators=lambda b: {"tokens": jnp.maximum(b["loss_mask"].sum(), 1.0)},
    schema=RL_FIELDS, eval_metrics=lambda aux, d: aux,
    doc="per-row sum of sampled-token log-probs (the k1 KL pre-pass of rl_step)"))


def episode_sums(values: jax.Array, episode_ids: jax.Array) -> jax.Array:
    """Each row gets the sum of `values` [B] over the rows of its episode -> [B]."""
    same = (episode_ids[:, None] == episode_ids[None, :]).astype(jnp.float32)
    return same @ values


def advantages_and_kl(batch: dict, kl_rows: jax.Array | None, beta: float):
    """(advantages [B], k1 per episode [B] or None) of a batch: R - beta * k1 (episode sum of the
    rows' k1) minus its group mean, episodes weighted once (`sample_weight`)."""
    rewards = batch["rewards"]
    kl_ep = None
    if kl_rows is not None:
        kl_ep = episode_sums(kl_rows, batch["episode_ids"])
        rewards = rewards - beta * kl_ep
    adv = objectives.dr_grpo_advantages(rewards, batch["group_ids"], batch["sample_weight"])
    return adv * (batch["sample_weight"] > 0), kl_ep


@dataclasses.dataclass(frozen=True)
class RLStepFns:
    """The RL step and what it was built from.

    rl_step(state, batch) -> (state, metrics): jitted; `state` is a `TrainState` (donated), `batch`
    the arrays of `make_batch` (numpy, or placed with `place_batch`). With beta > 0 the frozen
    reference weights (`ref`: (params, buffers), placed like the state) are held here and passed
    to the jitted function as arguments. pure_step(state, batch, ref) -> (state, metrics): the
    un-jitted function (ref None or (params, buffers)) for callers that compose it into a bigger
    program. fns: the builder's StepFns (placement, merge, param/master dtypes, optimizer).
    """
    rl_step: Callable
    pure_step: Callable
    fns: StepFns
    ref: tuple | None = None

    def merge(self, params: dict, buffers: dict):
        """A model module holding `params` (cast to execution.param_dtype) and `buffers`, e.g. to
        hand to the inference engine."""
        return self.fns.merge(params, buffers)

    def place_batch(self, batch: dict) -> dict:
        """This host's share of a batch (numpy) as global arrays on the mesh (or as is)."""
        return self.fns.place_batch(batch)


def make_rl_step(graphdef, abstract_params, abstract_buffers, tx, cfg: Config, pc=None):
    """The pure (un-jitted) `step(state, batch, ref) -> (state, metrics)` (module docstring)."""
    train_step, _ = make_step_fns(graphdef, abstract_params, abstract_buffers, tx, cfg, pc,
                                  loss=RL_POLICY_LOSS)
    _, seq_logp = make_step_fns(graphdef, abstract_params, abstract_buffers, tx, cfg, pc,
                                loss=RL_SEQ_LOGP)
    rl, replay = cfg.rl, replays_routers(cfg)

    def step(state: TrainState, batch: dict, ref=None):
        batch = {k: jnp.asarray(v) for k, v in batch.items()}
        if not replay:
            batch.pop("router_replay", None)
        kl_rows = None
        if rl.kl_coef > 0:
            if ref is None:
                raise ValueError("rl.kl_coef > 0 needs the reference weights (build_rl_step)")
            seq = {k: v for k, v in batch.items() if k in _SEQ_FIELDS}
            cur = seq_logp(state, seq)["seq_logp"]
            ref_state = state.replace(params=ref[0], buffers=ref[1])
            kl_rows = jax.lax.stop_gradient(cur - seq_logp(ref_state, seq)["seq_logp"])
        adv, kl_ep = advantages_and_kl(batch, kl_rows, rl.kl_coef)
        new_state, metrics = train_step(state, dict(batch, advantages=adv))
        if kl_ep is not None:
            w = batch["sample_weight"]
            metrics["kl_k1"] = jnp.sum(w * kl_ep) / jnp.maximum(w.sum(), 1e-9)
        return new_state, metrics

    return step


def build_rl_step(model, cfg: Config, mesh=None) -> tuple[RLStepFns, TrainState]:
    """The RL step for `model` (an nnx Transformer holding the initial policy) and `cfg`, with the
    initial TrainState (placed on `mesh` when given: the builder's `Placement`, the batch fields by
    `RL_FIELDS`). The reference policy (beta > 0 only) is a frozen copy of the initial weights,
    sharded like the policy; with beta = 0 none is kept and its pass is skipped."""
    # one source of truth for the length of an RL run: the schedule spans rl.steps updates (a
    # warm-up longer than that is cut to the run)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(
        cfg.train, steps=cfg.rl.steps, warmup_steps=min(cfg.train.warmup_steps, cfg.rl.steps)))
    fns, state = build(model, cfg, mesh, loss=RL_POLICY_LOSS)
    pc = None if mesh is None else context_from_config(mesh, cfg.mesh)
    pure = make_rl_step(fns.graphdef, fns.abstract_params, fns.abstract_buffers, fns.tx, cfg, pc)
    ref = None
    if cfg.rl.kl_coef > 0:      # a frozen copy (the state itself is donated by every step)
        ref = (jax.tree.map(jnp.copy, state.params), jax.tree.map(jnp.copy, state.buffers))
    if pc is None:
        jitted = jax.jit(pure, donate_argnums=0)
    else:
        st, rep = fns.placement.state, fns.placement.replicated
        ref_sh = None if ref is None else (st.params, st.buffers)
        if any(t == AxisType.Explicit for t in mesh.axis_types):
            pure_fn = jax.sharding.auto_axes(pure, out_sharding=(st, rep))
        else:
            pure_fn = pure
        jitted = api.jit_with_context(pure_fn, pc, in_shardings=(st, None, ref_sh),
                                      out_shardings=(st, rep), donate_argnums=(0,))
    step = functools.partial(_call_with_ref, jitted, ref)
    return RLStepFns(rl_step=step, pure_step=pure, fns=fns, ref=ref), state


def _call_with_ref(jitted, ref, state, batch):
    return jitted(state, batch, ref)
