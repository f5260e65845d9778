"""Pallas kernels for block-scaled (MXFP8 / NVFP4) training: quantize, block-scaled matmul, grouped matmul.

Every kernel has a portable Pallas version (interpret mode on CPU, Triton on CUDA) that is tested
against composer_jax.quant's reference numerics (quantization bit for bit, matmuls up to the order of
the f32 sums inside a block's dot, which XLA leaves to the CPU), plus backend variants selected with
`variant=`: "hopper" (fp8 MMA with per-block rescale), "blackwell" (the matmuls use sm_100's
native block-scaled tcgen05 MMA through Mosaic GPU; no interpret mode, checked by lowering), "tpu"
((8, 128)-tiled scale blocks, K grid axis with a VMEM accumulator). This package does not import composer_jax (imports go downwards).
"""

from pallas_kernels.block_matmul import block_scaled_matmul
from pallas_kernels.grouped_matmul import grouped_block_scaled_matmul
from pallas_kernels.quantize import quantize_mxfp8, quantize_nvfp4

__all__ = ["block_scaled_matmul", "grouped_block_scaled_matmul", "quantize_mxfp8", "quantize_nvfp4"]
