"""Compile for a real TPU slice from a machine without one: libtpu's compile-only devices.

With the TPU runtime installed (`pip install -e '.[tpu]'`, i.e. `jax[tpu]`, which brings
`libtpu`), `jax.experimental.topologies.get_topology_desc(name, platform="tpu")` returns the
devices of any TPU slice (`v5e:2x2`, `v5p:4x4x4`, `v6e:16x16`, `tpu7x:8x8x4`, ...): a mesh of them
lowers and compiles with the real XLA:TPU compiler (Mosaic for Pallas kernels) while this process
runs on CPU. Nothing can execute on them; `compiled.memory_analysis()` is the TPU compiler's
per-device memory (what MaxText's train_compile checks before a pod run).

`topology_devices(name)` returns the devices (clear errors: no libtpu names the install; a bad
name lists the valid forms); `target_info` describes the slice (platform, topology, device kind,
HBM per chip); `compiled_memory` reads a compiled program's per-device bytes. Programs must be
traced inside `composer_jax.parallel.target.compiling_for("tpu")` so that code choosing a
platform path (CPU fast paths, the padded ragged all-to-all emulation, kernel variants) takes the
TPU one: `lower_and_compile` does both.
"""
from __future__ import annotations

import importlib.util
import os
import re
import time

from composer_jax.errors import ConfigError
from composer_jax.parallel.target import compiling_for

INSTALL = ("pip install -e '.[tpu]' (requirements/tpu.txt: jax[tpu]==0.12.0.1, which brings "
           "libtpu, about 640 MB)")
# Chip families libtpu knows, with one slice name each (chips along each ICI axis).
FAMILIES = {"v4": "v4:2x2x2", "v5e": "v5e:2x2", "v5p": "v5p:4x4x4", "v6e": "v6e:16x16",
            "tpu7x": "tpu7x:8x8x4"}
# HBM per chip by XLA device kind (Cloud TPU system-architecture pages; GiB).
HBM_GIB = {"TPU v4": 32, "TPU v5 lite": 16, "TPU v5e": 16, "TPU v5": 95, "TPU v5p": 95,
           "TPU v6 lite": 32, "TPU v6e": 32, "TPU7x": 192}
_NAME = re.compile(r"^([a-z0-9]+):(\d+(?:x\d+)+)$")


def libtpu_installed() -> bool:
    """Whether the TPU compiler (libtpu) can be loaded in this environment."""
    return importlib.util.find_spec("libtpu") is not None


def valid_names_hint() -> str:
    return ("valid topology names are FAMILY:AxB or FAMILY:AxBxC (chips along each ICI axis, a "
            "shape the family is sold in) with FAMILY one of "
            + ", ".join(f"{f} (e.g. {ex})" for f, ex in FAMILIES.items()))


def check_name(name: str) -> tuple[str, tuple[int, ...]]:
    """(family, shape) of a topology name; ConfigError listing the valid forms otherwise."""
    m = _NAME.match(name)
    fam = m.group(1) if m else None
    if not m or fam not in FAMILIES:
        raise ConfigError(f"unknown TPU topology {name!r}; {valid_names_hint()}")
    return fam, tuple(int(s) for s in m.group(2).split("x"))


def topology_devices(name: str) -> list:
    """The compile-only devices of TPU slice `name` (e.g. 'v5e:2x2'), in libtpu's order."""
    check_name(name)
    if not libtpu_installed():
        raise ConfigError(f"compiling for TPU topology {name!r} needs the TPU compiler (libtpu), "
                          f"which is not installed: {INSTALL}")
    # compile-only use never touches a chip: several processes (the planner's subprocess, pytest
    # workers, other users) may load libtpu at once; without this the second one fails on
    # /tmp/libtpu_lockfile
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies
    try:
        return list(topologies.get_topology_desc(topology_name=name, platform="tpu").devices)
    except Exception as e:    # libtpu's own rejection of a shape it does not build
        raise ConfigError(f"libtpu cannot build TPU topology {name!r}: {str(e).strip()[:400]}; "
                          f"{valid_names_hint()}") from None


def target_info(name: str, devices: list) -> dict:
    """What the program was compiled for: platform, topology, device kind, chips and devices (a
    TPU7x chip is two devices, one per TensorCore), HBM per chip and per device."""
    kind = devices[0].device_kind
    gib = HBM_GIB.get(kind)
    chips = len({tuple(getattr(d, "coords", (d.id,))) for d in devices})
    per_chip = None if gib is None else gib * 2**30
    return {"platform": devices[0].platform, "topology": name, "device_kind": kind,
            "num_chips": chips, "num_devices": len(devices),
            "hbm_bytes_per_chip": per_chip,
            "hbm_bytes_per_device": None if gib is None else per_chip * chips // len(devices),
            "compiled_for_target": True}


def oom_report(err: Exception) -> dict | None:
    """{used, temps, limit, message} when XLA:TPU refused a program for exceeding HBM, else None.
    Two message forms: "Used X of Y hbm" (used: the whole program) and "the total memory required
    for HLO temporaries (X) exceeds available HBM (Y)" (temps: the temporaries alone)."""
    msg = str(err)
    if "RESOURCE_EXHAUSTED" not in msg and "Ran out of memory" not in msg:
        return None
    scale = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    size = lambda num, unit: int(float(num) * scale[unit])  # noqa: E731
    used = temps = limit = None
    m = re.search(r"Used ([\d.]+)([KMGT]?)(?:i?B)? of ([\d.]+)([KMGT]?)(?:i?B)? hbm", msg)
    if m:
        used, limit = size(m.group(1), m.group(2)), size(m.group(3), m.group(4))
    m = re.search(r"HLO temporaries \(([\d.]+)([KMGT]?)(?:i?B)?\) exceeds available HBM "
                  r"\(([\d.]+)([KMGT]?)(?:i?B)?\)", msg)
    if m:
        temps, limit = size(m.group(1), m.group(2)), size(m.group(3), m.group(4))
    return {"used": used, "temps": temps, "limit": limit, "message": msg[:3000]}


def compiled_memory(compiled) -> dict:
    """XLA's memory analysis of a compiled program, per device, with `total` = arguments + outputs
    - aliased + temporaries + generated code (what one device must hold at the peak)."""
    mem = compiled.memory_analysis()
    keys = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
            "temp_size_in_bytes", "generated_code_size_in_bytes")
    out = {k: int(getattr(mem, k)) for k in keys}
    out["total"] = (out["argument_size_in_bytes"] + out["output_size_in_bytes"]
                    - out["alias_size_in_bytes"] + out["temp_size_in_bytes"]
                    + out["generated_code_size_in_bytes"])
    return out


def lower_and_compile(jitted, *args, platform: str = "tpu", mesh=None):
    """(compiled, seconds): `jitted.lower(*args).compile()` traced for `platform` (under `mesh`
    when given); the arguments are ShapeDtypeStructs carrying shardings over target devices."""
    import contextlib

    import jax

    t0 = time.time()
    with compiling_for(platform), (jax.set_mesh(mesh) if mesh is not None
                                   else contextlib.nullcontext()):
        lowered = jitted.lower(*args)
    compiled = lowered.compile()
    return compiled, round(time.time() - t0, 1)


def fits(total: int, hbm: int | None) -> bool | None:
    """Whether a per-device total fits the chip's HBM (None when the HBM is unknown)."""
    return None if hbm is None else total <= hbm
