"""Pluggable losses for the one train-step builder (`composer_jax.train.step`).

A loss is a `LossSpec` registered by name (`register_loss`); the step builder finds it with
`get_loss(name)` and keeps everything else in one place: microbatching (gradient accumulation),
context-parallel reordering, mesh placement, the non-finite guard, router-bias updates.

  fn(model, batch, ctx) -> (loss_sum, aux_sums)

    model      the Transformer (nnx module) holding the current parameters.
    batch      one microbatch as the model sees it: every field of the loss's schema, reordered
               to the load-balanced token order under context parallelism and sharded by its
               logical axes; derived fields `token_index` [B,T] and (mtp_depth > 0)
               `mtp_tokens` [Dm,B,T] are present.
    ctx        a `LossContext`: `ctx.forward(model, batch)` (the one model call: router replay,
               quantization key and context parallelism handled), `ctx.denominators` (the
               global ones, computed by `denominators(batch)` on the whole step batch before it
               is split), the token-chunked LM-head helpers, `ctx.cfg`.
    loss_sum   a float32 scalar: this microbatch's additive share of the objective, i.e. its sums
               divided by the global denominators; summed over microbatches it is the full-batch
               objective, so microbatched gradients equal full-batch gradients.
    aux_sums   a dict of float32 arrays, summed over microbatches (e.g. per-term losses already
               divided by their denominators, or raw sums), except the keys named in the spec's
               `max_aux`, which are max-reduced over microbatches (e.g. a largest ratio).

  denominators(batch) -> dict of arrays (computed once per step on the unsplit batch; reported)
  metrics(aux_totals, denominators) -> dict name -> scalar (the step adds loss, grad_norm,
                                         expert_load_max_over_mean, update_skipped)
  eval_metrics(aux_totals, denominators) -> dict for the eval step (optional)
  schema: the batch fields the loss reads (composer_jax.parallel.batch_schema)

Shape glossary: B sequences, T tokens, V vocab, D model dim, Dm MTP depth, Lm MoE layers,
K experts per token, n token chunks.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

import jax
import jax.numpy as jnp

from composer_jax.errors import ConfigError
from composer_jax.model.transformer import ModelOutput, lm_logits
from composer_jax.parallel.batch_schema import BatchSchema
from composer_jax.parallel.sharding import (compute_value, shard, vocab_parallel_axes,
                                            vocab_parallel_head, vocab_parallel_tokens)
from composer_jax.train import losses

# Per-device tokens per chunk of the LM-head losses (main CE, MTP, z-loss), at most: the
# [tokens, V] float32 logits of a chunk (and their gradient) are the largest buffers the losses
# hold. On a mesh chunks are also cut to LOSS_CHUNK_BYTES of logits per device (64 MiB: 128
# tokens at V = 129,280), which XLA:TPU holds about twice (logits and their gradient).
LOSS_CHUNK_TOKENS = 2048
LOSS_CHUNK_BYTES = 64 << 20


def loss_chunks(batch: int, seq: int, pc=None, chunk_tokens: int = LOSS_CHUNK_TOKENS,
                vocab: int | None = None, chunk_bytes: int = LOSS_CHUNK_BYTES) -> int:
    """How many token chunks the LM-head losses run in: halved until a chunk holds at most
    chunk_tokens per-device tokens (at least half that) and, with `vocab`, at most chunk_bytes
    of float32 logits per device, as long as every chunk keeps the sequence's split over the
    context shards (1 = unchunked)."""
    b_shards = pc.size(*pc.axes_of("batch")) if pc is not None else 1
    t_shards = pc.size(*pc.axes_of("seq")) if pc is not None else 1
    per_device = max(batch // b_shards, 1) * max(seq // t_shards, 1)
    n = 1
    while seq % (2 * n * t_shards) == 0 and (
            per_device // (2 * n) >= chunk_tokens
            or (vocab is not None and (per_device // n) * vocab * 4 > chunk_bytes
                and per_device // n > 1)):
        n *= 2
    return n


@dataclasses.dataclass(frozen=True)
class LossContext:
    """What a loss function gets besides the model and the batch (see the module docstring).

    cfg: the whole Config; pc: the ParallelContext (None on one device); denominators: global,
    from the LossSpec; key: PRNG key of NVFP4's stochastic rounding (None otherwise);
    chunk_tokens: per-device tokens per LM-head chunk.
    """
    cfg: Any
    pc: Any
    denominators: dict
    key: jax.Array | None = None
    chunk_tokens: int = LOSS_CHUNK_TOKENS
    outputs: list = dataclasses.field(default_factory=list)   # model outputs, for expert loads

    @property
    def cp(self) -> int:
        """Context-parallel degree (1 = none): the batch is in load-balanced order when > 1."""
        return self.pc.context_parallel if self.pc is not None else 1

    def forward(self, model, batch: dict, **kwargs) -> ModelOutput:
        """The model on `batch` without full-vocabulary logits (`out.normed` [B,T,D] and
        `out.mtp_normed` [Dm,B,T,D] feed the chunked LM-head helpers). Passes router replay
        (`router_replay` [Lm,B,T,K], `mtp_router_replay` [Dm,B,T,K]) when the batch has it. The
        step reads the expert loads of every output for the router-bias update. The sequence-wise
        balance loss is computed when train.seq_aux_loss_coef > 0."""
        kwargs.setdefault("balance_loss", self.cfg.train.seq_aux_loss_coef > 0)
        out = model(batch["tokens"], positions=batch["positions"],
                    segment_ids=batch["segment_ids"],
                    router_replay=batch.get("router_replay"),
                    mtp_router_replay=batch.get("mtp_router_replay"),
                    token_index=batch["token_index"], mtp_tokens=batch.get("mtp_tokens"),
                    quant_key=self.key, logits=False, **kwargs)
        self.outputs.append(out)
        return out

    def vocab_axes(self) -> tuple[str, ...] | None:
        """Mesh axes the loss splits the LM head's vocabulary over (None: one device, or the
        head gathered whole); see `sharding.vocab_parallel_axes`."""
        if self.pc is None:
            return None
        m, d = self.cfg.model, self.cfg.data
        rows = d.global_batch_size // max(self.cfg.train.microbatches, 1)
        n = self.n_chunks(rows, d.seq_len)
        tokens = max(rows // self.pc.size(*self.pc.axes_of("batch")), 1) * max(
            d.seq_len // self.pc.size(*self.pc.axes_of("seq")), 1) // n
        return vocab_parallel_axes((m.hidden_size, m.vocab_size), max(tokens, 1))

    def lm_head(self, model) -> jax.Array:
        """The LM head weight [D,V] as the loss reads it (pass it as a `shared` operand): on a
        mesh with its vocabulary split (`vocab_parallel_head`: its gradient is produced split,
        never full-size), else in its compute layout."""
        axes = self.vocab_axes()
        if axes is None:
            return compute_value(model.lm_head)
        return vocab_parallel_head(model.lm_head, axes)

    def logits(self, h: jax.Array, w: jax.Array) -> jax.Array:
        """Normed hidden [B,t,D] @ head [D,V] in the compute dtype -> f32 logits [B,t,V]
        (vocabulary-split on a mesh: `lm_head`)."""
        dtype = jnp.dtype(self.cfg.execution.compute_dtype.value)
        axes = self.vocab_axes()
        if axes is None:
            return shard(lm_logits(h, w, dtype), ("batch", "seq", "act_vocab"))
        h = vocab_parallel_tokens(h, axes)
        return vocab_parallel_tokens(lm_logits(h, w, dtype), axes, vocab_last=True)

    def n_chunks(self, b: int, t: int) -> int:
        return loss_chunks(b, t, self.pc, self.chunk_tokens,
                           None if self.pc is None else self.cfg.model.vocab_size)

    def chunked_sum(self, fn: Callable, chunked: tuple, shared: tuple = ()):
        """sum over token chunks of fn(*chunk(chunked), *shared): chunked arrays are [B,T,...],
        so no [B,T,V] logits exist at once (`losses.sum_over_token_chunks`)."""
        n = self.n_chunks(*chunked[0].shape[:2])
        return losses.sum_over_token_chunks(fn, n, chunked, shared)

    def chunked_map(self, fn: Callable, chunked: tuple, shared: tuple = ()):
        """Per-token outputs [B,T,...] of fn(*chunk(chunked), *shared), chunk by chunk."""
        n = self.n_chunks(*chunked[0].shape[:2])
        return losses.map_over_token_chunks(fn, n, chunked, shared)

    def target_logprobs(self, model, hidden: jax.Array, targets: jax.Array) -> jax.Array:
        """log softmax(head(hidden))[targets] -> [B,T] f32, computed in token chunks (gradients
        flow to the model). hidden [B,T,D] (e.g. `out.normed`), targets [B,T] int."""
        def fn(h, tgt, w):
            return losses.target_logprobs(self.logits(h, w), tgt)
        return self.chunked_map(fn, (hidden, targets), (self.lm_head(model),))

    def expert_counts(self) -> dict:
        """{"moe": [Lm,E] or None, "mtp": [Dm,E] or None}: loads of the recorded forwards."""
        moe = mtp = None
        for out in self.outputs:
            if out.expert_counts is not None:
                moe = out.expert_counts if moe is None else moe + out.expert_counts
            if out.mtp_expert_counts is not None:
                mtp = (out.mtp_expert_counts if mtp is None else mtp + out.mtp_expert_counts)
        return {"moe": moe, "mtp": mtp}


def _identity_metrics(aux: dict, denominators: dict) -> dict:
    return dict(aux)


@dataclasses.dataclass(frozen=True)
class LossSpec:
    """A named loss for the step builder (see the module docstring for each callable)."""
    name: str
    fn: Callable
    denominators: Callable
    schema: BatchSchema
    metrics: Callable = _identity_metrics
    eval_metrics: Callable | None = None
    doc: str = ""
    max_aux: tuple[str, ...] = ()    # aux keys max-reduced over microbatches (the rest are summed)


_REGISTRY: dict[str, LossSpec] = {}
# Modules that register built-in losses; imported on the first lookup.
_BUILTIN_MODULES = ("composer_jax.train.lm_loss",)


def register_loss(spec: LossSpec) -> LossSpec:
    """Adds `spec` to the registry under `spec.name` (re-registering the same spec is a no-op;
    another spec under a taken name is an error). Returns it, so it can decorate an assignment."""
    old = _REGISTRY.get(spec.name)
    if old is not None and old != spec:
        raise ConfigError(f"a different loss is already registered as {spec.name!r}")
    _REGISTRY[spec.name] = spec
    return spec


def get_loss(name: str) -> LossSpec:
    """The registered LossSpec called `name`."""
    for m in _BUILTIN_MODULES:
        importlib.import_module(m)
    if name not in _REGISTRY:
        raise ConfigError(f"train.loss={name!r} is not a registered loss; registered: "
                          f"{sorted(_REGISTRY)} (a loss registers itself when its module is "
                          f"imported: composer_jax.train.loss_api.register_loss)")
    return _REGISTRY[name]


def registered_losses() -> tuple[str, ...]:
    for m in _BUILTIN_MODULES:
        importlib.import_module(m)
    return tuple(sorted(_REGISTRY))
