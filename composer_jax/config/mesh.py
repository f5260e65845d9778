"""The `mesh` section: sizes of the named mesh axes and the sharding-rules preset."""
from __future__ import annotations

import dataclasses
import math

from composer_jax.config.checks import _check, _coerce_enums


MESH_AXES = ("data", "fsdp", "expert", "context", "tensor")


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Sizes of the named mesh axes; at most one may be -1 (filled from the device count).

    `rules` names a preset of the logical-axis -> mesh-axis rules table (composer_jax.parallel).
    `dcn_*` give the sizes of each axis across slices/hosts over the slow network (1 = all ICI).
    """
    data: int = 1
    fsdp: int = -1
    expert: int = 1
    context: int = 1
    tensor: int = 1
    dcn_data: int = 1
    dcn_fsdp: int = 1
    rules: str = "fsdp"
    num_devices: int = 0   # 0 = all visible devices; > 0 with --dry_run makes a virtual mesh
    cp_attention: str = "allgather"   # context-parallel attention: "allgather" (MLA latent) | "ring"
    axis_type: str = "auto"           # "auto" (GSPMD propagation) | "explicit" (sharding in types)

    def __post_init__(self):
        _coerce_enums(self, "mesh")
        sizes = self.axis_sizes()
        autos = [a for a, s in sizes.items() if s == -1]
        _check(len(autos) <= 1, f"mesh: at most one axis may be -1 (auto), got {autos}")
        for a, s in sizes.items():
            _check(s == -1 or s >= 1, f"mesh.{a} must be >= 1 or -1 (auto), got {s}")
        _check(self.dcn_data >= 1 and self.dcn_fsdp >= 1, "mesh.dcn_* must be >= 1")
        _check(self.num_devices >= 0, f"mesh.num_devices must be >= 0, got {self.num_devices}")
        _check(self.rules in ("fsdp", "ep_fsdp", "cp_ep"),
               f"mesh.rules: unknown preset {self.rules!r}; choose one of fsdp, ep_fsdp, cp_ep")
        _check(self.cp_attention in ("allgather", "ring"),
               f"mesh.cp_attention must be 'allgather' or 'ring', got {self.cp_attention!r}")
        _check(self.axis_type in ("auto", "explicit"),
               f"mesh.axis_type must be 'auto' or 'explicit', got {self.axis_type!r}")

    def axis_sizes(self) -> dict[str, int]:
        return {a: getattr(self, a) for a in MESH_AXES}

    def resolved(self, num_devices: int) -> dict[str, int]:
        """Axis sizes with the -1 axis filled so their product is `num_devices`."""
        sizes = self.axis_sizes()
        fixed = math.prod(s for s in sizes.values() if s != -1)
        auto = [a for a, s in sizes.items() if s == -1]
        if auto:
            _check(num_devices % fixed == 0,
                   f"mesh: {num_devices} devices are not divisible by the fixed axes "
                   f"{ {a: s for a, s in sizes.items() if s != -1} } (product {fixed})")
            sizes[auto[0]] = num_devices // fixed
        _check(math.prod(sizes.values()) == num_devices,
               f"mesh: axis sizes {sizes} multiply to {math.prod(sizes.values())}, "
               f"but there are {num_devices} devices")
        return sizes
