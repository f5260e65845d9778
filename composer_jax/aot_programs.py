"""Every program a pod runs, as (jitted function, abstract sharded arguments) for AOT compiles.

`build(kind, cfg, mesh)` returns a `Program` for kind:

  rl        the RL update step (`rl.step.make_rl_step`: Dr.GRPO advantages, the rl_policy loss
            through the train-step builder, the k1 pre-pass when rl.kl_coef > 0) on a batch of
            data.global_batch_size x data.seq_len rows, state/batch placed as the trainer does;
  prefill   the engine's prefill step (`inference.steps.prefill_step`): inference.prefill_batch rows
            (rounded up to a multiple of the batch mesh shards) of a chunk as long as the context,
            into the MLA latent cache of inference.max_batch slots x inference.max_len positions;
  decode    one plain decode step for every slot over that cache;
  spec      one MTP speculative step (verify 1 + inference.spec_depth tokens, draft again; the
            MTP caches included); spec_depth 0 uses depth 1 (needs model.mtp_depth >= 1);
  kernels   each TPU Pallas kernel (block-scaled matmul, grouped matmul, quantize) at the
            model's production shapes (`kernel_cases`), compiled by Mosaic for one chip.

Nothing is allocated: parameters, caches and batches are `jax.ShapeDtypeStruct`s carrying their
shardings on `mesh` (a mesh of TPU compile-only devices from `composer_jax.parallel.aot`, or fake
CPU devices). The engine steps shard the weights by the mesh rules (`state_shardings`) and the
cache slots over the batch mesh axes; the engine traces them with the rules active so the model's
own constraints (expert sharding of the MoE weights) apply as in training.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pallas_kernels as pk
from composer_jax.errors import ConfigError
from composer_jax.inference import engine, steps
from composer_jax.inference.cache import init_cache
from composer_jax.inference.sampling import SamplerArrays
from composer_jax.inference.speculative import init_spec_state
from composer_jax.model import abstract_model
from composer_jax.parallel import api
from composer_jax.parallel.batch_schema import BatchSchema
from composer_jax.parallel.sharding import activate, context_from_config, state_shardings
from composer_jax.rl.step import RL_FIELDS, RL_POLICY_LOSS, make_rl_step
from composer_jax.train.placement import abstract_batch
from composer_jax.train.plan import abstract_state
from composer_jax.train.step import build_fns


@dataclasses.dataclass(frozen=True)
class Program:
    """name: what it is; jitted: has .lower(*args); args: abstract sharded arguments;
    detail: the shapes it was built at (for the report)."""
    name: str
    jitted: Any
    args: tuple
    detail: dict


def _abstract(tree, shardings):
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        tree, shardings)


def _sds(shape, dtype, sharding):
    return jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype), sharding=sharding)


# ---------------------------------------------------------------- RL update step

def rl_program(cfg, mesh) -> Program:
    fns = build_fns(abstract_model(cfg.model, cfg.execution), cfg, mesh, loss=RL_POLICY_LOSS)
    pc = context_from_config(mesh, cfg.mesh)
    pure = make_rl_step(fns.graphdef, fns.abstract_params, fns.abstract_buffers, fns.tx, cfg, pc)
    pl = fns.placement
    state = pl.with_shardings(abstract_state(fns), pl.state)
    fields = [n for n in RL_FIELDS.names(derived=False) if n != "logp_old"
              and (n != "router_replay" or cfg.rl.router_replay)]
    schema = BatchSchema({k: RL_FIELDS[k] for k in fields})
    lm = cfg.model.num_moe_layers
    raw = abstract_batch(cfg, schema, dims={"router_replay": (lm, cfg.model.num_experts_per_tok)})
    batch = _abstract(raw, api.batch_shardings(raw, pc, RL_FIELDS))
    ref, ref_sh = None, None
    if cfg.rl.kl_coef > 0:
        ref = (state.params, state.buffers)
        ref_sh = (pl.state.params, pl.state.buffers)
    jitted = api.jit_with_context(pure, pc, in_shardings=(pl.state, None, ref_sh),
                                  out_shardings=(pl.state, pl.replicated), donate_argnums=(0,))
    return Program("rl", jitted.jitted, (state, batch, ref),
                   {"batch": cfg.data.global_batch_size, "seq_len": cfg.data.seq_len,
                    "kl_pass": cfg.rl.kl_coef > 0, "router_replay": cfg.rl.router_replay})


# ---------------------------------------------------------------- engine steps

def _engine_parts(cfg, mesh, depth: int):
    """(graphdef, abstract sharded weights, cache, spec state, slot sharding, pc)."""
    pc = context_from_config(mesh, cfg.mesh)
    model = abstract_model(cfg.model, cfg.execution)
    graphdef, state = nnx.split(model)
    w_sh = state_shardings(state, pc)
    weights = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                           state, w_sh)
    b, s = cfg.inference.max_batch, cfg.inference.max_len
    batch_axes = tuple(a for a in pc.axes_of("batch") if pc.sizes[a] > 1)
    n = math.prod(pc.sizes[a] for a in batch_axes) if batch_axes else 1
    slot_axes = batch_axes if batch_axes and b % n == 0 else ()
    slot = NamedSharding(mesh, P(slot_axes or None))
    layer = NamedSharding(mesh, P(None, slot_axes or None))     # [L, B, S, C]
    cache = jax.eval_shape(lambda: init_cache(cfg.model, b, s, with_mtp=depth > 0,
                                              dtype=cfg.execution.compute_dtype))
    cache = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=layer), cache)
    spec = None
    if depth:
        spec = jax.eval_shape(lambda: init_spec_state(b, depth))
        spec = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=slot), spec)
    return graphdef, weights, cache, spec, slot, pc, n


def _sampler(rows: int, sh):
    return SamplerArrays(_sds((rows,), "float32", sh), _sds((rows,), "int32", sh),
                         _sds((rows,), "float32", sh), _sds((rows,), "int32", sh))


def _jit_engine(fn, pc, mesh):
    def traced(*args):
        with activate(pc):
            return fn(*args)
    return jax.jit(traced, donate_argnums=(1, 2))


def engine_program(kind: str, cfg, mesh) -> Program:
    depth = 0
    if kind == "spec":
        depth = cfg.inference.draft_depth or 1
        if cfg.model.mtp_depth < depth:
            raise ConfigError(f"the spec program drafts {depth} token(s) with the MTP modules; "
                              f"model.mtp_depth={cfg.model.mtp_depth}")
    elif kind == "prefill":
        depth = cfg.inference.draft_depth
    graphdef, weights, cache, spec, slot, pc, shards = _engine_parts(cfg, mesh, depth)
    b, s = cfg.inference.max_batch, cfg.inference.max_len
    rep = NamedSharding(mesh, P())
    capture = cfg.inference.capture_router
    keys = _sds((b, 2), "uint32", slot)
    if kind == "prefill":
        rows = -(-cfg.inference.prefill_batch // shards) * shards   # a multiple of the batch shards
        fn = functools.partial(steps.prefill_step, graphdef, depth=depth, capture=capture)
        args = (weights, cache, spec, _sds((rows, s), "int32", rep), _sds((rows,), "int32", rep),
                _sds((rows,), "int32", rep), _sds((rows,), "int32", rep),
                _sds((rows,), "int32", rep), _sampler(rows, rep), _sds((rows, 2), "uint32", rep),
                _sds((rows,), "int32", rep))
        detail = {"rows": rows, "chunk": s}
    else:
        fn = functools.partial(engine._decode, graphdef, depth=depth, capture=capture)
        args = (weights, cache, spec, _sds((b,), "int32", slot), _sds((b,), "int32", slot),
                _sds((b,), "bool", slot), _sampler(b, slot), keys, _sds((b,), "int32", slot))
        detail = {"spec_depth": depth} if depth else {}
    detail = {"max_batch": b, "max_len": s, **detail,
              "cache_bytes": sum(math.prod(x.shape) * x.dtype.itemsize
                                 for x in jax.tree.leaves(cache))}
    return Program(kind, _jit_engine(fn, pc, mesh), args, detail)


# ---------------------------------------------------------------- Pallas kernels

def kernel_cases(cfg) -> list[tuple[str, Callable, tuple, dict]]:
    """(name, fn, abstract args, shapes) of each TPU kernel at the model's production shapes:
    one microbatch's tokens on a device times the expert FFN (gate/up projection D -> F; the
    grouped matmul over the experts a device holds)."""
    m_cfg = cfg.model
    d, f = m_cfg.hidden_size, m_cfg.moe_intermediate_size
    experts = m_cfg.num_routed_experts
    # tokens one device routes per microbatch step: seq_len x top-k, capped to keep compile small
    m = min(cfg.data.seq_len * max(m_cfg.num_experts_per_tok, 1), 16384)
    bs = 32
    e8 = "float8_e4m3fn"
    common = dict(block_size=bs, scale_kind="e8m0", variant="tpu", interpret=False)
    g = min(experts, 16)
    sds = lambda shape, dt: jax.ShapeDtypeStruct(shape, jnp.dtype(dt))  # noqa: E731
    return [
        ("block_scaled_matmul", functools.partial(pk.block_scaled_matmul, **common),
         (sds((m, d), e8), sds((m, d // bs), "uint8"), sds((d, f), e8),
          sds((d // bs, f), "uint8")), {"m": m, "k": d, "n": f}),
        ("grouped_block_scaled_matmul", functools.partial(pk.grouped_block_scaled_matmul, **common),
         (sds((m, d), e8), sds((m, d // bs), "uint8"), sds((g, d, f), e8),
          sds((g, d // bs, f), "uint8"), sds((g,), "int32")), {"m": m, "k": d, "n": f, "groups": g}),
        ("quantize_mxfp8", functools.partial(pk.quantize_mxfp8, variant="tpu", interpret=False),
         (sds((m, d), "bfloat16"),), {"rows": m, "cols": d}),
    ]


def kernel_programs(cfg, device) -> list[Program]:
    """One single-chip Program per kernel case (arguments placed on `device`)."""
    sh = jax.sharding.SingleDeviceSharding(device)
    out = []
    for name, fn, args, shapes in kernel_cases(cfg):
        placed = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh) for a in args)
        out.append(Program(f"kernel:{name}", jax.jit(fn), placed, shapes))
    return out


def build(kind: str, cfg, mesh) -> list[Program]:
    """The Programs of one kind (`kernels` gives one per kernel)."""
    if kind == "rl":
        return [rl_program(cfg, mesh)]
    if kind in ("prefill", "decode", "spec"):
        return [engine_program(kind, cfg, mesh)]
    if kind == "kernels":
        return kernel_programs(cfg, mesh.devices.flat[0])
    raise ValueError(f"unknown program kind {kind!r}")
