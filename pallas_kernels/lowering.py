"""Lower a function for `cuda` or `tpu` from a CPU-only machine (no device needed).

This runs the Pallas -> Triton / Mosaic lowering, which rejects unsupported ops, dtypes and block
shapes; it does not run the device compiler (register/VMEM limits are checked only on hardware).

Mosaic GPU kernels (the blackwell variant) pick their target architecture from the abstract
device's `compute_capability` (jax/experimental/mosaic/gpu/utils.py `_infer_arch`, which falls
back to sm_90 when the attribute is missing); `lower_for` attaches it, looked up from
`COMPUTE_CAPABILITY` by device kind, so a Blackwell device kind lowers the tcgen05 MMA for sm_100.
"""

from __future__ import annotations

import dataclasses

import jax
from jax.sharding import AbstractDevice, AbstractMesh

CUDA_DEVICE_KIND = "NVIDIA H100 80GB HBM3"
BLACKWELL_DEVICE_KIND = "NVIDIA B200"
COMPUTE_CAPABILITY = {CUDA_DEVICE_KIND: "9.0", BLACKWELL_DEVICE_KIND: "10.0"}
PLATFORMS = ("cuda", "tpu")


@dataclasses.dataclass(frozen=True, slots=True)
class GpuAbstractDevice(AbstractDevice):
    """An AbstractDevice that also names its CUDA compute capability ("major.minor")."""

    compute_capability: str = "9.0"


def cuda_device(device_kind: str = CUDA_DEVICE_KIND) -> GpuAbstractDevice:
    """The abstract CUDA device for `device_kind` (a ValueError lists the known kinds)."""
    if device_kind not in COMPUTE_CAPABILITY:
        raise ValueError(f"unknown CUDA device kind {device_kind!r}; known: {sorted(COMPUTE_CAPABILITY)}")
    return GpuAbstractDevice(device_kind=device_kind, num_cores=None, platform="cuda",
                             compute_capability=COMPUTE_CAPABILITY[device_kind])


def lower_for(platform: str, fn, *args, device_kind: str = CUDA_DEVICE_KIND):
    """jax.jit(fn).trace(*args).lower(...) for `platform` ("cuda" or "tpu"); returns the Lowered."""
    if platform == "tpu":
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("tpu",))
    if platform != "cuda":
        raise ValueError(f"platform must be one of {PLATFORMS}, got {platform!r}")
    mesh = AbstractMesh((1,), ("x",), abstract_device=cuda_device(device_kind))
    with jax.sharding.use_abstract_mesh(mesh):
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))


def custom_call_targets(lowered) -> set[str]:
    """Names of the custom calls in a Lowered's StableHLO (e.g. the Triton or Mosaic kernel call)."""
    import re

    return set(re.findall(r"custom_call @([\w.$]+)", lowered.as_text()))
