"""Every kernel lowers for cuda (Triton: portable and hopper variants; Mosaic GPU: the blackwell
variant's matmuls, for an sm_100 device) and tpu (Mosaic: tpu variant)."""

import functools

import jax
import jax.numpy as jnp
import pytest

import pallas_kernels as pk
from pallas_kernels.lowering import BLACKWELL_DEVICE_KIND, CUDA_DEVICE_KIND, cuda_device, custom_call_targets, lower_for

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


# The blackwell variant: quantize kernels are the Triton ones; the matmuls are Mosaic GPU kernels
# whose lowering must emit the block-scaled tcgen05 MMA of the format's kind.
MMA_KIND = {"mxfp8": "tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale",
            "nvfp4": "tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale"}


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_blackwell_variant_lowers_for_sm100(name):
    fn, kw, args = KERNELS[name]
    lowered = lower_for("cuda", functools.partial(fn, variant="blackwell", interpret=False, **kw), *args,
                        device_kind=BLACKWELL_DEVICE_KIND)
    if name.startswith("quantize"):
        assert TARGET["cuda"] in custom_call_targets(lowered)
        return
    assert "mosaic_gpu_v2" in custom_call_targets(lowered)
    text = lowered.as_text()
    assert MMA_KIND[name.split("_")[1]] in text and "tcgen05.cp" in text  # native MMA, scales via TMEM


def test_blackwell_device_targets_sm100():
    from jax.experimental.mosaic.gpu import utils as mgpu_utils

    for kind_, arch in ((BLACKWELL_DEVICE_KIND, (10, 0)), (CUDA_DEVICE_KIND, (9, 0))):
        mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=cuda_device(kind_))
        with jax.sharding.use_abstract_mesh(mesh):
            assert mgpu_utils._infer_arch() == arch
    with pytest.raises(ValueError, match="unknown CUDA device kind"):
        cuda_device("NVIDIA GeForce 256")


def test_blackwell_variant_is_rejected_for_hopper():
    fn, kw, args = KERNELS["matmul_mxfp8"]
    with pytest.raises(ValueError, match="tcgen05 GPU"):
        lower_for("cuda", functools.partial(fn, variant="blackwell", interpret=False, **kw), *args)
