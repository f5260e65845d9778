"""Typed `key.path=value` overrides on frozen config dataclasses.

Syntax (repeatable, applied left to right):
  --set train.lr=3e-4            a scalar field (int, float, str, bool, enum by value)
  --set model=small              a whole section replaced by a named preset (SECTION_PRESETS)
  --set model.rope.factor=32     nested sections by dots
  --set data.roots=a,b           tuple fields as comma-separated values ("" = empty tuple)

An unknown key names the valid keys at that level; a badly typed value says what type was expected.
"""
from __future__ import annotations

import dataclasses
import enum
import types
import typing

from composer_jax.config.build import build_dataclass, field_types, section_class  # noqa: F401
from composer_jax.errors import ConfigError


_field_types = field_types


def parse_value(text: str, typ, where: str):
    """Parses `text` as a value of type `typ`; raises ConfigError naming `where` and the type."""
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if text.lower() in ("none", "null") and len(args) < len(typing.get_args(typ)):
            return None
        return parse_value(text, args[0], where)
    if origin is tuple:
        args = typing.get_args(typ)
        elem = args[0] if args else str
        if text.strip() == "":
            return ()
        return tuple(parse_value(t.strip(), elem, where) for t in text.split(","))
    if isinstance(typ, type) and issubclass(typ, enum.Enum):
        valid = [m.value for m in typ]
        for m in typ:
            if text == m.value or text.lower() == m.name.lower():
                return m
        raise ConfigError(f"{where}: {text!r} is not a valid {typ.__name__}; expected one of {valid}")
    if typ is bool:
        low = text.lower()
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"{where}: expected a bool (true/false), got {text!r}")
    if typ is int:
        try:
            return int(text)
        except ValueError:
            try:
                f = float(text)
            except ValueError:
                f = None
            if f is not None and f.is_integer():
                return int(f)
            raise ConfigError(f"{where}: expected an int, got {text!r}") from None
    if typ is float:
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"{where}: expected a float, got {text!r}") from None
    if typ is str:
        return text
    raise ConfigError(f"{where}: fields of type {typ} cannot be set from the command line")


def _set_in_dict(cls, d: dict, key: str, text: str, presets: dict, prefix: str = "") -> None:
    """Sets dotted `key` inside `d` (the dict form of dataclass `cls`), type-checking the value."""
    head, _, rest = key.partition(".")
    where = prefix + head
    names = [f.name for f in dataclasses.fields(cls)]
    if head not in names:
        raise ConfigError(f"unknown config key {where!r}; valid keys at this level: "
                          f"{', '.join(prefix + n for n in names)}")
    typ = _field_types(cls)[head]
    if dataclasses.is_dataclass(typ):
        typ = section_class(typ, d.get(head))
    if rest:
        if not dataclasses.is_dataclass(typ):
            raise ConfigError(f"{where} is a {getattr(typ, '__name__', typ)}, not a section; "
                              f"cannot set {prefix + key!r}")
        _set_in_dict(typ, d[head], rest, text, (presets or {}).get(head) or {}, where + ".")
    elif dataclasses.is_dataclass(typ):
        table = (presets or {}).get(head) or {}
        if not isinstance(table, dict) or text not in table or not callable(table[text]):
            valid = sorted(table) if isinstance(table, dict) else []
            raise ConfigError(f"{where} is a section; set one of its keys ({where}.KEY=VALUE) "
                              f"or a preset name: {valid or 'none defined'}; got {text!r}")
        from composer_jax.config import to_dict
        d[head] = to_dict(table[text]())
    else:
        value = parse_value(text, typ, where)
        d[head] = value.value if isinstance(value, enum.Enum) else (
            list(value) if isinstance(value, tuple) else value)


def apply_overrides(cfg, overrides: list[str], presets: dict | None = None):
    """Applies `key=value` strings in order and validates the result once, at the end (so
    `--set train.steps=4 --set train.warmup_steps=1` works in either order).

    Unknown keys and badly typed values fail at the override that names them; an invalid
    combination fails with the section's validation message.
    """
    from composer_jax.config import to_dict
    d = to_dict(cfg)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.path=value")
        key, _, text = item.partition("=")
        _check_moved(type(cfg), key.strip())
        _set_in_dict(type(cfg), d, key.strip(), text.strip(), presets or {})
    try:
        return build_dataclass(type(cfg), d)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(str(e)) from None


def _check_moved(cls, key: str) -> None:
    """An old spelling (`model.remat`, `rl.backend`, ...: keys that moved to another section) is
    an error that names the new key, never silently accepted."""
    from composer_jax.config import Config
    from composer_jax.config.legacy import moved_key
    new = moved_key(key) if cls is Config else None
    if new is not None:
        why = ("the model section holds the architecture only" if key.startswith("model.")
               else "the rl section has the sections rl.task, rl.job and rl.weight_sync")
        raise ConfigError(f"config key {key!r} has moved to {new!r} ({why}); use --set {new}=...")


@dataclasses.dataclass(frozen=True)
class KeyInfo:
    """One settable config key: dotted name, type name, value in a config, dataclass default."""
    key: str
    type_name: str
    value: object
    default: object


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
    if isinstance(v, enum.Enum):
        return v.value
    return v


def config_keys(cfg, defaults=None, prefix: str = "") -> list[KeyInfo]:
    """Every leaf key of config dataclass `cfg` (recursively), with its type, its value in `cfg`
    and its default: the field's dataclass default, or its value in `defaults` when given."""
    out = []
    hints = _field_types(type(cfg))
    for f in dataclasses.fields(cfg):
        typ, value = hints[f.name], getattr(cfg, f.name)
        if defaults is not None:
            default = getattr(defaults, f.name)
        elif f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None
        if dataclasses.is_dataclass(typ):
            same = dataclasses.is_dataclass(default) and type(default) is type(value)
            out += config_keys(value, default if same else type(value)(), prefix + f.name + ".")
        else:
            out.append(KeyInfo(prefix + f.name, _type_name(typ), _plain(value), _plain(default)))
    return out
