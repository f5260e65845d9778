"""16-point random Hadamard transform (RHT) applied blockwise along an axis, and its inverse.

R = diag(s) @ H16 / 4 with random signs s in {-1, +1}; R is orthogonal, so applying it to both
inputs of a GEMM along the contraction axis leaves the product unchanged (x R)(y R)^T = x y^T
while spreading outliers across each 16-element block before NVFP4 quantization.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from composer_jax.errors import ConfigError

RHT_SIZE = 16


def hadamard_matrix(n: int = RHT_SIZE) -> np.ndarray:
    """Sylvester Hadamard matrix [n, n] with +-1 entries (n a power of two)."""
    if n < 1 or n & (n - 1):
        raise ConfigError(f"Hadamard size must be a power of two, got {n}")
    h = np.ones((1, 1), np.float32)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def rht_matrix(key: jax.Array) -> jax.Array:
    """Random orthogonal [16, 16] float32 matrix diag(signs) @ H16 / 4 drawn from `key`."""
    signs = jax.random.rademacher(key, (RHT_SIZE,), jnp.float32)
    return signs[:, None] * jnp.asarray(hadamard_matrix() / np.sqrt(RHT_SIZE))


def random_hadamard(x: jax.Array, key: jax.Array, axis: int = -1, *, inverse: bool = False) -> jax.Array:
    """Apply the 16-point RHT (or its inverse) to each block of 16 along `axis`.

    Shapes: x [..., D, ...] with D = x.shape[axis] a multiple of 16; returns float32 [x.shape].
    The same `key` must be used for both GEMM operands (and for the inverse).
    """
    if not -x.ndim <= axis < x.ndim:
        raise ConfigError(f"axis {axis} out of range for an array of rank {x.ndim}")
    d = x.shape[axis]
    if d % RHT_SIZE:
        raise ConfigError(f"random Hadamard transform: axis size {d} is not a multiple of {RHT_SIZE}")
    r = rht_matrix(key)
    r = r.T if inverse else r
    xm = jnp.moveaxis(x.astype(jnp.float32), axis, -1)
    xb = xm.reshape(*xm.shape[:-1], d // RHT_SIZE, RHT_SIZE)
    y = jnp.einsum("...i,ij->...j", xb, r, precision=jax.lax.Precision.HIGHEST)
    return jnp.moveaxis(y.reshape(xm.shape), -1, axis)
