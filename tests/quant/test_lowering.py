"""Every kernel lowers for cuda (Triton: portable and hopper variants) and tpu (Mosaic: tpu variant)."""

import functools

import jax
import jax.numpy as jnp
import pytest

import pallas_kernels as pk
from pallas_kernels.lowering import custom_call_targets, lower_for

S = jax.ShapeDtypeStruct
F8 = jnp.float8_e4m3fn
M, K, N, G = 200, 256, 300, 4
KERNELS = {
    "quantize_mxfp8": (pk.quantize_mxfp8, {}, (S((M, K), jnp.bfloat16),)),
    "quantize_nvfp4": (pk.quantize_nvfp4, {}, (S((M, K), jnp.bfloat16), S((), jnp.float32))),
    "quantize_nvfp4_sr": (pk.quantize_nvfp4, {}, (S((M, K), jnp.bfloat16), S((), jnp.float32), S((M, K), jnp.uint32))),
    "quantize_nvfp4_2d": (pk.quantize_nvfp4, {"tile_2d": True}, (S((K, K), jnp.bfloat16), S((), jnp.float32))),
    "matmul_mxfp8": (pk.block_scaled_matmul, {"block_size": 32, "scale_kind": "e8m0"},
                     (S((M, K), F8), S((M, K // 32), jnp.uint8), S((K, N), F8), S((K // 32, N), jnp.uint8))),
    "matmul_nvfp4": (pk.block_scaled_matmul, {"block_size": 16, "scale_kind": "e4m3"},
                     (S((M, K), F8), S((M, K // 16), F8), S((K, N), F8), S((K // 16, N), F8), S((), jnp.float32))),
    "grouped_mxfp8": (pk.grouped_block_scaled_matmul, {"block_size": 32, "scale_kind": "e8m0"},
                      (S((M, K), F8), S((M, K // 32), jnp.uint8), S((G, K, N), F8), S((G, K // 32, N), jnp.uint8), S((G,), jnp.int32))),
    "grouped_nvfp4": (pk.grouped_block_scaled_matmul, {"block_size": 16, "scale_kind": "e4m3"},
                      (S((M, K), F8), S((M, K // 16), F8), S((G, K, N), F8), S((G, K // 16, N), F8), S((G,), jnp.int32), S((), jnp.float32))),
}
# (variant, platform) pairs that must lower; the tpu variant carries TPU compiler params and is
# rejected for cuda by design, and the GPU variants' small scale blocks break Mosaic's (8, 128) rule.
PAIRS = [("portable", "cuda"), ("hopper", "cuda"), ("tpu", "tpu")]
TARGET = {"cuda": "__gpu$xla.gpu.triton", "tpu": "tpu_custom_call"}


@pytest.mark.parametrize("variant,platform", PAIRS)
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_lowers(name, variant, platform):
    fn, kw, args = KERNELS[name]
    lowered = lower_for(platform, functools.partial(fn, variant=variant, interpret=False, **kw), *args)
    assert TARGET[platform] in custom_call_targets(lowered)


def test_tpu_variant_is_rejected_for_cuda():
    fn, kw, args = KERNELS["matmul_mxfp8"]
    with pytest.raises(ValueError, match="tpu"):
        lower_for("cuda", functools.partial(fn, variant="tpu", interpret=False, **kw), *args)
