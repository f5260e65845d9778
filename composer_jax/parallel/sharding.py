"""The parallel context and the one sharding helper, `shard(x, logical_axes)`.

Sharding is opt-in: with no active `ParallelContext` every helper here is the identity, and the
model runs unchanged on one device. `activate(pc)` sets the JAX mesh (`jax.set_mesh`) and the rules
table for the code traced inside it.

`shard` is correct on both mesh kinds: on Explicit mesh axes it is `jax.sharding.reshard`
(sharding in types), on Auto axes `jax.lax.with_sharding_constraint`; axes that are Manual (inside
`jax.shard_map`) are left alone.

Note: the rules are read at trace time and are not part of jit's cache key; jit a function once per
ParallelContext (as `composer_jax.parallel.api` does), not the same function under two rule sets.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import enum
import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from composer_jax.errors import ConfigError
from composer_jax.parallel.mesh import mesh_shape
from composer_jax.parallel.rules import Rules, get_rules, logical_to_spec


class CPAttention(str, enum.Enum):
    ALLGATHER = "allgather"   # all-gather the MLA latent + shared rope key (576 values/token)
    RING = "ring"             # pass K/V blocks around the context ring, online softmax


@dataclasses.dataclass(frozen=True)
class ParallelContext:
    """A mesh (concrete or abstract), its rules, and the context-parallel attention kind."""
    mesh: object
    rules: Rules
    cp_attention: CPAttention = CPAttention.ALLGATHER

    @property
    def sizes(self) -> dict[str, int]:
        return mesh_shape(self.mesh)

    def size(self, *axes: str) -> int:
        n = 1
        for a in axes:
            n *= self.sizes.get(a, 1)
        return n

    def axes_of(self, logical: str) -> tuple[str, ...]:
        """Mesh axes (of size > 1) a logical activation axis is split over."""
        return tuple(a for a in self.rules.mesh_axes(logical) if self.sizes.get(a, 1) > 1)

    @property
    def expert_parallel(self) -> bool:
        return self.rules.expert_parallel and self.sizes.get("expert", 1) > 1

    @property
    def context_parallel(self) -> int:
        """Context-parallel degree (1 = off)."""
        return self.size(*self.axes_of("seq")) if self.rules.context_parallel else 1


def context_from_config(mesh, mesh_cfg) -> ParallelContext:
    return ParallelContext(mesh, get_rules(mesh_cfg.rules), CPAttention(mesh_cfg.cp_attention))


_CURRENT: contextvars.ContextVar[ParallelContext | None] = contextvars.ContextVar(
    "composer_jax_parallel", default=None)


def current() -> ParallelContext | None:
    """The active ParallelContext, or None (single device, no sharding)."""
    return _CURRENT.get()


@contextlib.contextmanager
def activate(pc: ParallelContext):
    """Makes `pc` the context for code traced inside (sets the JAX mesh too)."""
    token = _CURRENT.set(pc)
    try:
        if jax.sharding.get_abstract_mesh().empty:
            with jax.set_mesh(pc.mesh):
                yield pc
        else:   # inside jit/shard_map: the mesh is already set by the caller
            yield pc
    finally:
        _CURRENT.reset(token)


def _axis_kinds():
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return {}
    return dict(zip(mesh.axis_names, mesh.axis_types))


def constrain(x: jax.Array, spec: P) -> jax.Array:
    """Applies `spec` to x: reshard on Explicit axes, a sharding constraint on Auto axes."""
    kinds = _axis_kinds()
    if not kinds:
        return x

    def keep(entry):
        if entry is None:
            return None
        names = entry if isinstance(entry, tuple) else (entry,)
        names = tuple(a for a in names if kinds.get(a) != AxisType.Manual)
        return None if not names else names[0] if len(names) == 1 else names

    spec = P(*(keep(e) for e in spec))
    if all(k == AxisType.Manual for k in kinds.values()):
        return x
    if any(k == AxisType.Explicit for k in kinds.values()):
        return jax.sharding.reshard(x, spec)
    return jax.lax.with_sharding_constraint(x, spec)


def shard(x: jax.Array, logical_axes) -> jax.Array:
    """Constrains activation x to the layout its logical axes map to (identity without a context)."""
    pc = current()
    if pc is None:
        return x
    spec = logical_to_spec(logical_axes, pc.rules, x.shape, pc.sizes, what="activation")
    return constrain(x, spec)


# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------


def _is_var(x) -> bool:
    return isinstance(x, nnx.Variable)


def _var_axes(v: nnx.Variable, ndim: int) -> tuple:
    axes = tuple(getattr(v, "axes", None) or ((None,) * ndim))
    if len(axes) == ndim + 1 and axes[0] == "layers":   # one layer of a stack (inside scan)
        axes = axes[1:]
    return axes


def param_spec(path, v, pc: ParallelContext, compute: bool = False) -> P:
    """PartitionSpec of one parameter (storage layout, or compute layout with FSDP axes gathered)."""
    shape = tuple(v.shape)
    axes = _var_axes(v, len(shape))
    drop = pc.rules.gather_axes if compute else ()
    name = jax.tree_util.keystr(path) if path is not None else "parameter"
    spec = logical_to_spec(axes, pc.rules, shape, pc.sizes, what=f"parameter {name}", drop=drop)
    if compute:   # experts stay on their shard (EP) even though `expert` is an FSDP axis elsewhere
        store = logical_to_spec(axes, pc.rules, shape, pc.sizes, what=f"parameter {name}")
        spec = P(*(s if ax == "expert" else c for s, c, ax in zip(store, spec, axes)))
    return spec


def state_shardings(state, pc: ParallelContext):
    """A tree like `state` (nnx State of Variables) with NamedSharding leaves (storage layout)."""
    return jax.tree.map_with_path(
        lambda p, v: v.replace(NamedSharding(pc.mesh, param_spec(p, v, pc))), state,
        is_leaf=_is_var)


# Parameters gathered for compute (FSDP shards all-gathered) and their compute-dtype copies are
# made by two ops, `gathered` and `compute_cast`: custom_vjp functions whose backward is exactly
# autodiff's (the transposed constraint; the cast back), and whose primal carries the name
# GATHERED, so that a remat policy can tell them apart (`saves_all_but_gathered`). Left to plain
# autodiff, a scanned layer's saved residuals include its gathered compute-dtype weights, full
# size on every device ([L, E, D, F] for the experts); under remat none on a mesh
# `transformer._remat` uses that policy: every activation is still saved, and the backward
# gathers the layer's parameter shards again, as FSDP does.
GATHERED = "fsdp_gathered"


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def gathered(x: jax.Array, spec: P) -> jax.Array:
    """`constrain(x, spec)` for a parameter gathered for compute (tagged GATHERED)."""
    return checkpoint_name(constrain(x, spec), GATHERED)


def _gathered_fwd(x, spec):
    return gathered(x, spec), None


def _gathered_bwd(spec, _, ct):
    return (constrain(ct, spec),)      # what autodiff does for a sharding constraint


gathered.defvjp(_gathered_fwd, _gathered_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _cast(w: jax.Array, dtype, from_dtype) -> jax.Array:
    return checkpoint_name(w.astype(dtype), GATHERED)


def _cast_fwd(w, dtype, from_dtype):
    return _cast(w, dtype, from_dtype), None


def _cast_bwd(dtype, from_dtype, _, ct):
    return (ct.astype(from_dtype),)    # what autodiff does for a cast


_cast.defvjp(_cast_fwd, _cast_bwd)


def compute_cast(w: jax.Array, dtype) -> jax.Array:
    """A parameter w in the compute dtype: `w.astype(dtype)`, under a context the GATHERED op."""
    if current() is None or w.dtype == jnp.dtype(dtype):
        return w.astype(dtype)
    return _cast(w, jnp.dtype(dtype), w.dtype)


def _is_gathered_op(params) -> bool:
    j = params.get("call_jaxpr")
    j = getattr(j, "jaxpr", j)
    return any(e.primitive.name == "name" and e.params.get("name") == GATHERED
               for e in getattr(j, "eqns", ()))


def saves_all_but_gathered(prim, *_, **params) -> bool:
    """Remat policy: every value is saveable except the outputs of `gathered` and
    `compute_cast` (recomputed from the parameter's storage shard: an all-gather and a cast)
    and of `pvary` (inside a shard_map, the no-op that marks a replicated value, e.g. such a
    weight, as varying over the manual axes; where its input is needed it is saved instead)."""
    if prim.name == "pvary":
        return False
    return not (prim.name == "custom_vjp_call" and _is_gathered_op(params))


def gather_for_compute(state):
    """Constrains every Variable of a (per-layer) state to its compute layout (tagged
    `GATHERED`); identity w/o context."""
    pc = current()
    if pc is None:
        return state

    def one(path, v):
        return v.replace(gathered(v[...], param_spec(path, v, pc, compute=True)))
    return jax.tree.map_with_path(one, state, is_leaf=_is_var)


def compute_value(v: nnx.Variable) -> jax.Array:
    """A parameter's value in its compute layout (FSDP storage axes gathered); `v[...]` without
    a context. For parameters used outside the scanned layers (embedding, LM head): a lookup or
    matmul against a table sharded over `embed` would otherwise leave its output split over the
    model dim, which XLA can only re-split over batch/seq by replicating it first."""
    pc = current()
    if pc is None:
        return v[...]
    return constrain(v[...], param_spec(None, v, pc, compute=True))


def _spec_axes(entry) -> tuple[str, ...]:
    return () if entry is None else entry if isinstance(entry, tuple) else (entry,)


def constrain_like_params(tree, abstract_params):
    """`tree` (a pure dict shaped like the parameters, e.g. their gradients) constrained to the
    parameters' storage layout; identity without a context. Applied to the gradients as they
    leave the backward pass, so XLA reduce-scatters each into its storage shard there and runs
    the optimizer update in the storage layout (left free, it may move the optimizer state to
    the gradient's layout instead: an all-to-all of params, mu and nu live for the whole step)."""
    pc = current()
    if pc is None:
        return tree
    specs = nnx.to_pure_dict(jax.tree.map_with_path(
        lambda path, v: v.replace(param_spec(path, v, pc)), abstract_params, is_leaf=_is_var))
    return jax.tree.map(lambda s, x: constrain(x, s), specs, tree,
                        is_leaf=lambda x: isinstance(x, P))


def resplit_is_one_all_to_all(d_axes: tuple[str, ...], tokens_spec) -> bool:
    """Whether moving the mesh axes `d_axes` (that split a [.., D] array's last dim) onto the
    token dims of `tokens_spec` (a [B, T] PartitionSpec) is one all-to-all: every one of them
    that splits a token dim splits the same dim, in the same order."""
    dims = [tuple(a for a in _spec_axes(e) if a in d_axes) for e in tokens_spec]
    used = [d for d in dims if d]
    if len(used) > 1:
        return False
    return not used or used[0] == tuple(a for a in d_axes if a in used[0])


def lookup_on_shards(v: nnx.Variable, ids: jax.Array) -> jax.Array | None:
    """Rows `ids` [B,T] of the table v [V,D] read where the table is stored, or None when that
    does not apply (no context, ids not [B,T], the vocabulary dim itself split).

    The table stays in its storage layout (the model dim split over the FSDP axes); the ids are
    gathered over those axes (int32, small) and every device reads its D-slice of every row:
    [B,T,D/n] split over D, the size of one device's [B/n,T,D] activations, which `shard`
    then re-splits over the batch (an all-to-all). Its transpose, the embedding gradient,
    scatter-adds into the local [V, D/n] slice: no device ever holds a full-size [V,D] gradient
    (gathering the table first made XLA scatter into a full [V,D] buffer and all-reduce it).

    Also None (the caller gathers the table) where that re-split is not one all-to-all
    (`resplit_is_one_all_to_all`): e.g. kimi's cp_ep mesh, whose model-dim axes (context,
    expert) split two token dims (seq, batch). There XLA:TPU re-splits the rows by all-gathering
    the whole microbatch's [B, T, D] embeddings on every device (bf16[64,32768,7168] per lookup
    at cpt_32k on v6e:16x16, forward and backward): 7.7 GiB more HLO temporaries than gathering
    the table (`benchmarks/results/tpu_fit_lookup.txt`)."""
    pc = current()
    if pc is None or ids.ndim != 2:
        return None
    spec = param_spec(None, v, pc)
    if spec[0] is not None:
        return None
    d_axes = _spec_axes(spec[1])
    if not d_axes:
        return None
    try:
        ids_spec = logical_to_spec(("batch", "seq"), pc.rules, ids.shape, pc.sizes,
                                   what="token ids", drop=d_axes)
        tokens_spec = logical_to_spec(("batch", "seq"), pc.rules, ids.shape, pc.sizes,
                                      what="token ids")
    except ConfigError:     # ids that do not split over the batch axes (e.g. a decode batch)
        return None
    if not resplit_is_one_all_to_all(d_axes, tokens_spec):
        return None
    table = constrain(v[...], spec)
    out = jnp.take(table, constrain(ids, ids_spec), axis=0)
    return constrain(out, P(*ids_spec, d_axes[0] if len(d_axes) == 1 else d_axes))


def vocab_parallel_axes(shape: tuple[int, int], tokens: int) -> tuple[str, ...] | None:
    """Mesh axes to split the LM head [D,V] (`shape`) over on its vocabulary dim for the loss,
    or None (no context, no candidate axis of size > 1 that V divides).

    Candidates: the tensor axis and the FSDP axes the model dim is stored on. Splitting over a
    group of g devices holds a [D, V/g] head slice and its gradient (6 D V / g bytes: bf16 weight,
    f32 gradient) and gathers the hidden states of the group's tokens per chunk (4 g D bytes per
    device token, with their gradient); the group minimising the sum for `tokens` per-device
    tokens per loss chunk is chosen (all of them on small meshes; a part on wide ones, where a
    [g x tokens, D] gather would outgrow the head)."""
    import itertools
    pc = current()
    if pc is None:
        return None
    d, v = shape
    store = logical_to_spec(("embed", "vocab"), pc.rules, shape, pc.sizes, what="LM head")
    cands = tuple(dict.fromkeys(_spec_axes(store[1]) + _spec_axes(store[0])))
    best, best_cost = None, 6 * d * v + 4 * tokens * d
    for r in range(1, len(cands) + 1):
        for axes in itertools.combinations(cands, r):
            g = pc.size(*axes)
            cost = 6 * d * v / g + 4 * tokens * g * d
            if v % g == 0 and cost < best_cost:
                best, best_cost = axes, cost
    return best


def vocab_parallel_head(w: nnx.Variable, axes: tuple[str, ...]) -> jax.Array:
    """The LM head [D,V] with its vocabulary split over `axes` ([D, V/n] per device): resharded
    from storage by an all-to-all, never gathered. Logits against it are [tokens, V/n] per
    device for all tokens of the shards (`vocab_parallel_tokens`), and the head's gradient is
    produced (and accumulated over token chunks) as [D, V/n]: the same bytes per device as the
    batch-split logits of a gathered head, without a full-size [D,V] weight or gradient."""
    return constrain(w[...], P(None, axes[0] if len(axes) == 1 else axes))


def vocab_parallel_tokens(x: jax.Array, axes: tuple[str, ...], vocab_last: bool = False):
    """x [B,t,...] with its batch/seq split kept except over `axes` (gathered there); with
    vocab_last the last dim (logits' vocabulary) is split over `axes`."""
    pc = current()
    spec = tuple(logical_to_spec(("batch", "seq"), pc.rules, x.shape[:2], pc.sizes,
                                 what="LM-head tokens", drop=axes))
    rest = [None] * (x.ndim - 2)
    if vocab_last:
        rest[-1] = axes[0] if len(axes) == 1 else axes
    return constrain(x, P(*spec, *rest))


def _key_name(k) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def shardings_like_params(tree, params, param_shardings, mesh):
    """NamedShardings for `tree` (e.g. an optimizer state): a leaf whose key path ends with a
    parameter's path and has that parameter's shape gets the parameter's sharding (Adam/Muon
    moments, however the optimizer nests or masks them); every other leaf is replicated.

    params / param_shardings: trees with the same structure (arrays or ShapeDtypeStructs, and
    NamedShardings)."""
    by_path = {}
    flat_p = jax.tree_util.tree_leaves_with_path(params)
    flat_s = jax.tree.leaves(param_shardings)
    for (path, leaf), sh in zip(flat_p, flat_s):
        by_path[tuple(_key_name(k) for k in path)] = (tuple(leaf.shape), sh)
    longest = max((len(k) for k in by_path), default=0)
    replicated = NamedSharding(mesh, P())

    def one(path, leaf):
        keys = tuple(_key_name(k) for k in path)
        for n in range(min(len(keys), longest), 0, -1):
            hit = by_path.get(keys[-n:])
            if hit is not None and hit[0] == tuple(getattr(leaf, "shape", ())):
                return hit[1]
        return replicated
    return jax.tree.map_with_path(one, tree)


def sharding_plan(state, pc: ParallelContext) -> dict[str, str]:
    """Parameter path -> 'shape dtype PartitionSpec' (storage layout), for review and goldens."""
    plan = {}
    for path, v in jax.tree_util.tree_leaves_with_path(state, is_leaf=_is_var):
        spec = param_spec(path, v, pc)
        key = "/".join(str(getattr(k, "key", k)) for k in path)
        plan[key] = f"{tuple(v.shape)} {v.dtype} {spec}"
    return plan


def check_batch(shape, pc: ParallelContext, what: str = "batch"):
    """Raises a ConfigError naming axes and sizes if [B, T] does not split over the mesh."""
    logical_to_spec(("batch", "seq"), pc.rules, shape[-2:], pc.sizes, what=what)


__all__ = ["CPAttention", "ParallelContext", "activate", "current", "shard", "constrain",
           "state_shardings", "shardings_like_params", "gather_for_compute", "compute_value",
           "GATHERED", "gathered", "compute_cast", "saves_all_but_gathered", "resplit_is_one_all_to_all",
           "lookup_on_shards", "constrain_like_params", "vocab_parallel_axes", "vocab_parallel_head", "vocab_parallel_tokens",
           "sharding_plan",
           "param_spec", "ConfigError"]
