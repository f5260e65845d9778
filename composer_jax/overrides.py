"""`apply_overrides`: config keys set from "key.path=value" strings, through the same absl flags as
`launch.py --config.KEY=VALUE` (composer_jax/config/flags.py), and `config_keys`, the key table of
`describe_config`.

  apply_overrides(cfg, ["train.lr=3e-4", "model=small", "data.roots=a,b"], SECTION_PRESETS)

An unknown key names the valid keys at that level; a badly typed value says what type was
expected; the result is validated once, at the end.
"""
from __future__ import annotations

import dataclasses
import enum
import types
import typing

from composer_jax.config.flags import NAME, leaf_keys, parse_config, rebased_config


def apply_overrides(cfg, overrides: list[str], presets: dict | None = None, rebase=None):
    """cfg with `key=value` strings applied in order (presets, then keys), validated once;
    `rebase` (an experiment's, `registry.Experiment.rebase`): applied again on the base it picks
    for the parsed config (`config.flags.rebased_config`), as launch.py does."""
    args = [f"--{NAME}.{o}" if "=" in o else f"--set={o}" for o in overrides]
    cfg = parse_config(cfg, args, presets or {})
    return cfg if rebase is None else rebased_config(cfg, args, presets or {}, rebase)


@dataclasses.dataclass(frozen=True)
class KeyInfo:
    """One settable config key: dotted name, type name, value in a config, default, help text."""
    key: str
    type_name: str
    value: object
    default: object
    help: str = ""


def _type_name(typ) -> str:
    origin = typing.get_origin(typ)
    if origin is tuple:
        args = typing.get_args(typ)
        return f"tuple[{_type_name(args[0]) if args else 'str'}]"
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(typ))
    if isinstance(typ, type) and issubclass(typ, enum.Enum):
        return "{" + "|".join(m.value for m in typ) + "}"
    return getattr(typ, "__name__", str(typ))


def _plain(v):
    return v.value if isinstance(v, enum.Enum) else v


def _defaults(cfg, defaults):
    """The default of every leaf: its value in `defaults`, else its section class's default."""
    out = {}

    def walk(obj, ref, prefix):
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                sub = getattr(ref, f.name) if ref is not None else None
                same = dataclasses.is_dataclass(sub) and type(sub) is type(value)
                walk(value, sub if same else type(value)(), prefix + f.name + ".")
            else:
                out[prefix + f.name] = getattr(ref, f.name) if ref is not None else (
                    f.default if f.default is not dataclasses.MISSING else
                    f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
    walk(cfg, defaults, "")
    return out


def config_keys(cfg, defaults=None) -> list[KeyInfo]:
    """Every leaf key of config dataclass `cfg` with its type, its value in `cfg`, its default (the
    field's dataclass default, or its value in `defaults` when given) and its help text."""
    dflt = _defaults(cfg, defaults)
    return [KeyInfo(k, _type_name(t), _plain(v), _plain(dflt[k]), h)
            for k, t, v, h in leaf_keys(cfg)]
