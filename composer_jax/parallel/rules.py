"""The one table mapping logical axis names to mesh axes, with named presets.

Parameters carry logical names in their `axes` metadata (composer_jax.model.layers.make_param);
activations get them at `shard(x, logical_axes)` calls. A rule maps a logical name to a tuple of
mesh axes (possibly empty = replicated). When two dims of one array map to the same mesh axis, the
first dim keeps it and later dims drop it (e.g. expert weights [expert, embed, expert_mlp] under
`ep_fsdp`: `expert` takes the expert axis, `embed` keeps only fsdp).

Presets:
  fsdp     ZeRO-3: parameters sharded over fsdp, context and expert, gathered per layer;
           batch over data/fsdp/expert/context; MoE dispatch local (dropless ragged_dot).
  ep_fsdp  experts on `expert` (all-to-all dispatch inside shard_map), everything else FSDP;
           batch over data/fsdp/expert/context.
  cp_ep    context parallelism: the sequence is split over `context` in load-balanced causal
           order; experts on `expert`; batch over data/fsdp/expert.
Every preset puts heads, FFN width, expert width and vocab on `tensor` (size 1 = off), so tensor
parallelism is independent of the expert axis.

`gather_axes`: mesh axes a parameter is only *stored* sharded over; `compute_spec` removes them, so
each scanned layer all-gathers its weights just before use (FSDP) and XLA frees them after.
"""
from __future__ import annotations

import dataclasses

from jax.sharding import PartitionSpec as P

from composer_jax.errors import ConfigError

Axes = tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Rules:
    name: str
    table: dict[str, Axes]           # logical name -> mesh axes
    gather_axes: Axes                # FSDP storage axes, removed for compute
    expert_parallel: bool            # MoE dispatch by all-to-all over the `expert` axis
    context_parallel: bool           # sequence split over `context`, load-balanced order

    def mesh_axes(self, logical: str | None) -> Axes:
        if logical is None:
            return ()
        if logical not in self.table:
            raise ConfigError(f"rules {self.name!r}: no rule for logical axis {logical!r}; "
                              f"known: {sorted(self.table)}")
        return self.table[logical]


_COMMON = {
    # parameters
    "layers": (), "norm": (), "head_dim": (), "router": (),
    "mtp_concat": (), "heads": ("tensor",), "mlp": ("tensor",), "expert_mlp": ("tensor",),
    "vocab": ("tensor",),
    # activations
    "act_embed": (), "act_heads": ("tensor",), "act_mlp": ("tensor",), "act_vocab": ("tensor",),
    "kv_seq": (), "act_kv": (), "act_k": (),
}


def _preset(name, *, embed, expert, batch, seq, gather, ep, cp) -> Rules:
    table = dict(_COMMON, embed=embed, q_lora=embed, kv_lora=embed, expert=expert, batch=batch,
                 seq=seq)
    return Rules(name, table, gather, ep, cp)


PRESETS: dict[str, Rules] = {
    "fsdp": _preset("fsdp", embed=("fsdp", "context", "expert"), expert=(),
                    batch=("data", "fsdp", "expert", "context"), seq=(),
                    gather=("fsdp", "context", "expert"), ep=False, cp=False),
    "ep_fsdp": _preset("ep_fsdp", embed=("fsdp", "context", "expert"), expert=("expert",),
                       batch=("data", "fsdp", "expert", "context"), seq=(),
                       gather=("fsdp", "context", "expert"), ep=True, cp=False),
    "cp_ep": _preset("cp_ep", embed=("fsdp", "context", "expert"), expert=("expert",),
                     batch=("data", "fsdp", "expert"), seq=("context",),
                     gather=("fsdp", "context", "expert"), ep=True, cp=True),
}


def get_rules(name: str) -> Rules:
    if name not in PRESETS:
        raise ConfigError(f"mesh.rules: unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]


def logical_to_spec(logical_axes, rules: Rules, shape=None, mesh_sizes=None,
                    what: str = "array", drop: Axes = ()) -> P:
    """PartitionSpec for an array with `logical_axes` (one name or None per dim).

    A mesh axis used by an earlier dim, or listed in `drop`, is skipped. Mesh axes of size 1 are
    left out. With `shape` and `mesh_sizes` the sharded dims are checked for divisibility; an error
    names the array, the dim, its logical axis, the mesh axes and their sizes.
    """
    logical_axes = tuple(logical_axes)
    if shape is not None and len(shape) != len(logical_axes):
        raise ConfigError(f"{what}: {len(logical_axes)} logical axes {logical_axes} for a "
                          f"rank-{len(shape)} array of shape {tuple(shape)}")
    used: set[str] = set()
    spec = []
    for i, name in enumerate(logical_axes):
        axes = tuple(a for a in rules.mesh_axes(name) if a not in used and a not in drop
                     and (mesh_sizes is None or mesh_sizes.get(a, 1) > 1))
        used.update(axes)
        if shape is not None and mesh_sizes is not None and axes:
            n = 1
            for a in axes:
                n *= mesh_sizes[a]
            if shape[i] % n:
                sizes = {a: mesh_sizes[a] for a in axes}
                raise ConfigError(
                    f"{what}: dim {i} (logical axis {name!r}) has size {shape[i]}, not divisible "
                    f"by mesh axes {sizes} (product {n}) under rules {rules.name!r}")
        spec.append(axes[0] if len(axes) == 1 else (axes or None))
    return P(*spec)
