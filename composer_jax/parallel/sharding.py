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

import jax
from flax import nnx
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


def gather_for_compute(state):
    """Constrains every Variable of a (per-layer) state to its compute layout; identity w/o context."""
    pc = current()
    if pc is None:
        return state

    def one(path, v):
        return v.replace(constrain(v[...], param_spec(path, v, pc, compute=True)))
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
           "sharding_plan",
           "param_spec", "ConfigError"]
