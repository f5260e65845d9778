"""The `mesh` section: sizes of the named mesh axes and the sharding-rules preset."""
from __future__ import annotations

import dataclasses
import math

from composer_jax.config.checks import _check, _coerce_enums


MESH_AXES = ("data", "fsdp", "expert", "context", "tensor")
COMPILE_PROGRAMS = ("rl", "prefill", "decode", "spec", "kernels")


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Sizes of the named mesh axes; at most one may be -1 (filled from the device count).

    `rules` names a preset of the logical-axis -> mesh-axis rules table (composer_jax.parallel).
    `dcn_*` give the sizes of each axis across slices/hosts over the slow network (1 = all ICI).
    `compile_topology` (with --dry_run): a libtpu TPU slice name such as "v5e:2x2" or
    "tpu7x:8x8x4"; the planner compiles with the real TPU compiler for that slice (the device count
    follows from it; composer_jax.parallel.aot) instead of for fake CPU devices. `compile_programs`:
    what it compiles besides the train step: a comma list of rl, prefill, decode, spec, kernels, or
    "all" (each lands in dry_run.json's `programs`).
    """
    data: int = 1                       # data-parallel axis size (-1 = fill from the devices)
    fsdp: int = -1  # fully sharded data-parallel axis size (-1 = fill from the devices)
    expert: int = 1                     # expert-parallel axis size
    context: int = 1                    # context-parallel axis size (sequence split)
    tensor: int = 1                     # tensor-parallel axis size
    dcn_data: int = 1                   # data axis size across slices (over DCN)
    dcn_fsdp: int = 1                   # fsdp axis size across slices (over DCN)
    rules: str = "fsdp"
    num_devices: int = 0   # 0 = all visible devices; > 0 with --dry_run makes a virtual mesh
    cp_attention: str = "allgather"   # context-parallel attention: "allgather" (MLA latent) | "ring"
    axis_type: str = "auto"           # "auto" (GSPMD propagation) | "explicit" (sharding in types)
    compile_topology: str = ""        # "" = CPU estimate; e.g. "v5p:8x8x4": compile for that TPU slice
    compile_programs: str = ""        # with compile_topology, also: rl,prefill,decode,spec,kernels|all

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
        progs = self.programs()
        bad = [p for p in progs if p not in COMPILE_PROGRAMS]
        _check(not bad, f"mesh.compile_programs: unknown program(s) {bad} in "
               f"{self.compile_programs!r}; a comma list of {', '.join(COMPILE_PROGRAMS)}, or all")
        _check(not progs or bool(self.compile_topology),
               "mesh.compile_programs needs mesh.compile_topology (a TPU slice to compile for)")

    def programs(self) -> tuple[str, ...]:
        """The programs a --dry_run with compile_topology compiles besides the train step."""
        names = [p.strip() for p in self.compile_programs.split(",") if p.strip()]
        if names == ["all"]:
            return COMPILE_PROGRAMS
        return tuple(names)

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
