"""Lower a function for `cuda` or `tpu` from a CPU-only machine (no device needed).

This runs the Pallas -> Triton / Mosaic lowering, which rejects unsupported ops, dtypes and block
shapes; it does not run the device compiler (register/VMEM limits are checked only on hardware).
"""

from __future__ import annotations

import jax
from jax.sharding import AbstractDevice, AbstractMesh

CUDA_DEVICE_KIND = "NVIDIA H100 80GB HBM3"
PLATFORMS = ("cuda", "tpu")


def lower_for(platform: str, fn, *args, device_kind: str = CUDA_DEVICE_KIND):
    """jax.jit(fn).trace(*args).lower(...) for `platform` ("cuda" or "tpu"); returns the Lowered."""
    if platform == "tpu":
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("tpu",))
    if platform != "cuda":
        raise ValueError(f"platform must be one of {PLATFORMS}, got {platform!r}")
    mesh = AbstractMesh((1,), ("x",), abstract_device=AbstractDevice(
        device_kind=device_kind, num_cores=None, platform="cuda"))
    with jax.sharding.use_abstract_mesh(mesh):
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))


def custom_call_targets(lowered) -> set[str]:
    """Names of the custom calls in a Lowered's StableHLO (e.g. the Triton or Mosaic kernel call)."""
    import re

    return set(re.findall(r"custom_call @([\w.$]+)", lowered.as_text()))
