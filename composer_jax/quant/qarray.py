"""QArray: a block-quantized array (element values, block scales, optional global scale)."""

from __future__ import annotations

import dataclasses

import jax


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QArray:
    """A block-scaled array.

    Fields:
      data: element values with the original shape, dtype float8_e4m3fn (mxfp8) or float4_e2m1fn
        (nvfp4).
      scales: one scale per block, same rank as `data` with each blocked axis divided by
        `block_size`; dtype float8_e8m0fnu (mxfp8) or float8_e4m3fn (nvfp4).
      global_scale: FP32 scalar per-tensor scale (nvfp4), else None.
      fmt: "mxfp8" or "nvfp4".
      block_size: elements per block along each blocked axis (32 or 16).
      axes: the blocked axes (one axis, or the last two for 16x16 NVFP4 weight tiles).
    """

    data: jax.Array
    scales: jax.Array
    global_scale: jax.Array | None
    fmt: str = dataclasses.field(metadata=dict(static=True))
    block_size: int = dataclasses.field(metadata=dict(static=True))
    axes: tuple[int, ...] = dataclasses.field(metadata=dict(static=True))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def ndim(self) -> int:
        return self.data.ndim

    @property
    def is_2d(self) -> bool:
        return len(self.axes) == 2
