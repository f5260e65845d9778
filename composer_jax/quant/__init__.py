"""Low precision: MXFP8 / NVFP4 reference numerics and the quantized dot used by the model.

Public API:
  quantize(x, fmt, axis=-1, *, block_2d=False, key=None, global_scale=None) -> QArray
  dequantize(q) -> float32 array
  quantized_matmul(x[..., K], w[K, N], fmt, key=None, *, backend="auto") -> [..., N]
  quantized_ragged_dot(x[M, K], w[G, K, N], group_sizes[G], fmt, key=None, *, backend="auto") -> [M, N]
  random_hadamard(x, key, axis=-1, *, inverse=False)
"""

from composer_jax.quant.dot import quantized_matmul
from composer_jax.quant.formats import DOT_FORMATS, FORMATS, MXFP8, NVFP4
from composer_jax.quant.hadamard import random_hadamard
from composer_jax.quant.qarray import QArray
from composer_jax.quant.quantize import dequantize, quantize
from composer_jax.quant.ragged import quantized_ragged_dot

__all__ = ["DOT_FORMATS", "FORMATS", "MXFP8", "NVFP4", "QArray", "dequantize", "quantize",
           "quantized_matmul", "quantized_ragged_dot", "random_hadamard"]
