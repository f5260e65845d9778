"""The two block-scaled formats: element type, block size, scale type and ranges.

MXFP8 (OCP microscaling): E4M3 elements (max 448), one E8M0 power-of-two scale per 32 contiguous
elements along the contraction axis. NVFP4: E2M1 elements (max 6), one E4M3 scale per 16 elements,
and one FP32 per-tensor ("global") scale amax / (448 * 6).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from composer_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Format:
    """Static description of a block-scaled format."""

    name: str
    block_size: int  # elements per scale along the blocked axis (16x16 tiles for NVFP4 weights)
    elem_dtype: object
    elem_max: float
    scale_dtype: object
    scale_max: float
    has_global_scale: bool


MXFP8 = Format("mxfp8", 32, jnp.float8_e4m3fn, 448.0, jnp.float8_e8m0fnu, 2.0**127, False)
NVFP4 = Format("nvfp4", 16, jnp.float4_e2m1fn, 6.0, jnp.float8_e4m3fn, 448.0, True)

FORMATS = {f.name: f for f in (MXFP8, NVFP4)}
DOT_FORMATS = ("bf16", "mxfp8", "nvfp4")
INPUT_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)


def get_format(name: str) -> Format:
    """Return the Format called `name`; a ConfigError lists the valid names otherwise."""
    if not isinstance(name, str) or name not in FORMATS:
        raise ConfigError(f"unsupported quantization format {name!r}; valid: {sorted(FORMATS)}")
    return FORMATS[name]


def check_input_dtype(x, what: str = "input") -> None:
    """Raise a ConfigError unless `x` is a float32/bfloat16/float16 array."""
    if not any(jnp.dtype(x.dtype) == jnp.dtype(d) for d in INPUT_DTYPES):
        valid = [jnp.dtype(d).name for d in INPUT_DTYPES]
        raise ConfigError(f"{what} has dtype {jnp.dtype(x.dtype).name}; quantization takes one of {valid}")
