"""The device mesh: named axes data/fsdp/expert/context/tensor built from a `MeshConfig`.

Axis order puts the axes that communicate most (tensor, then context, expert) last, so they land
on devices that are neighbours in `jax.devices()` order (the fast ICI/NVLink ring); `dcn_data` and
`dcn_fsdp` split data/fsdp across slices or hosts, which only exchange gradients (data) or gather
weights once per layer (fsdp) over the slow network.

`make_mesh(cfg, devices=None, axis_type="auto")`: a `jax.sharding.Mesh` with every axis Auto
(GSPMD propagation; the default) or Explicit (sharding in types).
"""
from __future__ import annotations

import math

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from composer_jax.config import MESH_AXES, MeshConfig
from composer_jax.errors import ConfigError

AXIS_TYPES = {"auto": AxisType.Auto, "explicit": AxisType.Explicit}


def _device_grid(sizes: dict[str, int], cfg: MeshConfig, devices: list) -> np.ndarray:
    """Devices arranged [data, fsdp, expert, context, tensor]; DCN axes outermost."""
    shape = tuple(sizes[a] for a in MESH_AXES)
    dcn = {"data": cfg.dcn_data, "fsdp": cfg.dcn_fsdp}
    for axis, n in dcn.items():
        if sizes[axis] % n:
            raise ConfigError(f"mesh: dcn_{axis}={n} must divide mesh.{axis}={sizes[axis]}")
    n_slices = cfg.dcn_data * cfg.dcn_fsdp
    if n_slices == 1:
        return np.asarray(devices, dtype=object).reshape(shape)
    if len(devices) % n_slices:
        raise ConfigError(f"mesh: {len(devices)} devices do not split into {n_slices} slices "
                          f"(dcn_data={cfg.dcn_data} x dcn_fsdp={cfg.dcn_fsdp})")
    # Slice-major device order: slice s holds devices [s*per, (s+1)*per). Each slice carries the
    # ICI part of every axis; data and fsdp are additionally split over slices.
    per = len(devices) // n_slices
    ici = [sizes[a] // dcn.get(a, 1) for a in MESH_AXES]
    grid = np.asarray(devices, dtype=object).reshape(cfg.dcn_data, cfg.dcn_fsdp, *ici)
    # [dd, df, d, f, e, c, t] -> [dd, d, df, f, e, c, t] -> merge (dd,d) and (df,f)
    grid = grid.transpose(0, 2, 1, 3, 4, 5, 6)
    assert per == math.prod(ici)
    return grid.reshape(shape)


def make_mesh(cfg: MeshConfig, devices=None, axis_type: str = "auto") -> Mesh:
    """A mesh over `devices` (default: all of `jax.devices()`) with axis sizes from `cfg`.

    Raises ConfigError naming the axes when sizes do not multiply to the device count.
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = cfg.resolved(len(devices))
    if axis_type not in AXIS_TYPES:
        raise ConfigError(f"mesh axis_type must be one of {sorted(AXIS_TYPES)}, got {axis_type!r}")
    grid = _device_grid(sizes, cfg, devices)
    return Mesh(grid, MESH_AXES, axis_types=(AXIS_TYPES[axis_type],) * len(MESH_AXES))


def mesh_shape(mesh) -> dict[str, int]:
    """Axis name -> size of a Mesh or AbstractMesh."""
    return dict(zip(mesh.axis_names, mesh.axis_sizes))
