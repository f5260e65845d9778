"""Building config dataclasses from their dict form (config.json, `to_dict` output, overrides).

A section whose class defines `section_class(d: dict) -> type` is polymorphic: the class to build
is chosen from the section's own dict (e.g. `rl.task`, whose `family` names the task family's
config class). No JAX, no other composer_jax imports but the error type.
"""
from __future__ import annotations

import dataclasses
import enum
import types
import typing

from composer_jax.errors import ConfigError


def field_types(cls) -> dict[str, type]:
    return typing.get_type_hints(cls)


def section_class(typ, d) -> type:
    """The class a section dict `d` of declared type `typ` builds (polymorphic sections)."""
    pick = getattr(typ, "section_class", None)
    return pick(d if isinstance(d, dict) else {}) if pick is not None else typ


def build_dataclass(cls, d: dict, prefix: str = ""):
    """Builds dataclass `cls` from a (JSON) dict, converting enums, tuples and nested sections."""
    cls = section_class(cls, d)
    hints = field_types(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - names
    if unknown:
        raise ConfigError(f"unknown config keys {sorted(prefix + u for u in unknown)}; "
                          f"valid: {sorted(prefix + n for n in names)}")
    kwargs = {}
    for name, value in d.items():
        typ = hints[name]
        kwargs[name] = _convert(value, typ, prefix + name)
    return cls(**kwargs)


def _scalar(value, typ, where):
    """value as a `typ` (int, float, str, bool): a flag's tuple element may arrive as text."""
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
            return value.lower() in ("true", "1")
        raise ConfigError(f"{where}: expected a bool (true/false), got {value!r}")
    if typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            return int(str(value))
        except ValueError:
            raise ConfigError(f"{where}: expected an int, got {value!r}") from None
    if typ is float:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected a float, got {value!r}") from None
    if typ is str:
        return value if isinstance(value, str) else str(value)
    return value


def _enum(value, typ, where):
    for m in typ:
        if value == m.value or (isinstance(value, str) and value.lower() == m.name.lower()):
            return m
    try:
        return typ(value)      # the enum's own aliases (its `_missing_`: e.g. the bool a field once was)
    except ValueError:
        pass
    raise ConfigError(f"{where}: {value!r} is not a valid {typ.__name__}; expected one of "
                      f"{[m.value for m in typ]}")


def _convert(value, typ, where):
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        typ = [a for a in typing.get_args(typ) if a is not type(None)][0]
        origin = typing.get_origin(typ)
    if dataclasses.is_dataclass(typ):
        if not isinstance(value, dict):
            raise ConfigError(f"{where} is a section; set its keys ({where}.KEY=VALUE)")
        return build_dataclass(typ, value, where + ".")
    if origin is tuple:
        args = typing.get_args(typ)
        if not isinstance(value, (tuple, list)):
            value = (value,)
        return tuple(_convert(v, args[0] if args else str, where) for v in value)
    if isinstance(typ, type) and issubclass(typ, enum.Enum):
        return _enum(value, typ, where)
    return _scalar(value, typ, where)
