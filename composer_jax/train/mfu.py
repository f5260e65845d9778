"""Peak FLOP/s for MFU: from the accelerator's spec sheet, or measured on CPU at start-up."""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp

# Dense bf16 peak FLOP/s per device (vendor spec sheets, without sparsity).
_PEAK_BF16 = {
    "H100": 989e12, "H200": 989e12, "B200": 2250e12, "A100": 312e12,
    "TPU v4": 275e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12, "TPU v5p": 459e12,
    "TPU v6 lite": 918e12, "TPU v6e": 918e12,
}


def measured_matmul_flops(n: int = 1024, repeats: int = 5, dtype=jnp.float32) -> float:
    """FLOP/s of a jitted n x n x n matmul on the default device (best of `repeats`)."""
    a = jnp.ones((n, n), dtype)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        f(a).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best


def peak_flops_per_device() -> tuple[float, str]:
    """(peak FLOP/s, where it came from)."""
    dev = jax.devices()[0]
    kind = getattr(dev, "device_kind", "")
    for key, val in _PEAK_BF16.items():
        if key.lower() in kind.lower():
            return val, f"spec sheet ({kind})"
    return measured_matmul_flops(), f"measured 1024^3 f32 matmul on {dev.platform}"
