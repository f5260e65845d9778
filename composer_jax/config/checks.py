"""Validation helpers shared by the config sections (no JAX, no other composer_jax imports
but the error type)."""
from __future__ import annotations

import dataclasses
import enum
import typing

from composer_jax.errors import ConfigError


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def _coerce_enums(obj, section: str) -> None:
    """Lets enum fields be given by value (e.g. dataclasses.replace(cfg, precision="mxfp8"))."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        typ, value = hints[f.name], getattr(obj, f.name)
        if isinstance(typ, type) and issubclass(typ, enum.Enum) and not isinstance(value, typ):
            try:
                object.__setattr__(obj, f.name, typ(value))
            except ValueError:
                raise ConfigError(f"{section}.{f.name}: {value!r} is not one of "
                                  f"{[m.value for m in typ]}") from None
