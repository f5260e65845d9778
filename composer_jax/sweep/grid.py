"""The points of a `launch.py --sweep`: the product of each axis's values.

An axis is `KEY=V1,V2,...` on the command line (`--sweep=train.lr=1e-3,3e-3 --sweep=seed=0,1`;
the values are flag text, typed by the config flags like `--config.KEY=V`), or a Python file
(`--sweep=grid.py`) defining

    SWEEP = {"train.lr": [1e-3, 3e-3], "seed": [0, 1]}    # key -> values (any config values)
    METRICS = ["val_loss", "loss"]                         # optional: the table's columns

A file's values may hold commas (tuples: `[("a", "b"), ("c",)]`); a command-line value may not.
"""
from __future__ import annotations

import dataclasses
import itertools
import runpy

from composer_jax.api import override_strings
from composer_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Grid:
    """axes: (key, value texts) in order; metrics: the table's columns ([]: chosen from the runs)."""
    axes: tuple[tuple[str, tuple[str, ...]], ...]
    metrics: tuple[str, ...] = ()

    def points(self) -> list[tuple[tuple[str, str], ...]]:
        """Every point: ((key, value text), ...) per axis, the last axis varying fastest."""
        keys = [k for k, _ in self.axes]
        return [tuple(zip(keys, vals)) for vals in itertools.product(*(v for _, v in self.axes))]


def point_name(point) -> str:
    """A trial's directory name: `lr=0.001,seed=0` (each key's last part; '/' made '_')."""
    return ",".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in point).replace("/", "_") or "base"


def _axis(key: str, values) -> tuple[str, tuple[str, ...]]:
    texts = tuple(override_strings({key: v})[0].split("=", 1)[1] for v in values)
    if not texts:
        raise ConfigError(f"--sweep axis {key!r} has no values")
    if len(set(texts)) != len(texts):
        raise ConfigError(f"--sweep axis {key!r} repeats a value: {list(texts)}")
    return key, texts


def parse_grid(specs: list[str]) -> Grid:
    """The grid of `--sweep` values: `KEY=V1,V2` axes and/or Python files (module docstring)."""
    axes, metrics = [], []
    for spec in specs:
        if spec.endswith(".py"):
            try:
                ns = runpy.run_path(spec)
            except FileNotFoundError:
                raise ConfigError(f"--sweep={spec}: no such file") from None
            sweep = ns.get("SWEEP")
            if not isinstance(sweep, dict) or not sweep:
                raise ConfigError(f"--sweep={spec} must define SWEEP = {{'key': [values, ...]}}")
            axes += [_axis(k, list(v)) for k, v in sweep.items()]
            metrics += list(ns.get("METRICS", []))
        elif "=" in spec:
            key, _, values = spec.partition("=")
            axes.append(_axis(key.strip(), [v.strip() for v in values.split(",")]))
        else:
            raise ConfigError(f"--sweep={spec!r}: expected KEY=V1,V2,... or a .py file defining "
                              f"SWEEP")
    keys = [k for k, _ in axes]
    if len(set(keys)) != len(keys):
        raise ConfigError(f"--sweep names a key twice: {keys}")
    return Grid(tuple(axes), tuple(metrics))
