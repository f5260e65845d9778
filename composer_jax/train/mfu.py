"""Peak FLOP/s for MFU: an accelerator's spec sheet, or on CPU the theoretical peak from `lscpu`
(cores x FLOP/cycle x clock). Beside it, on CPU, the *achieved matmul rate* (a jitted 1024^3
matmul measured at start-up): what this JAX/XLA build reaches on this machine, not a peak.
"""
from __future__ import annotations

import re
import subprocess
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
    """Achieved FLOP/s of a jitted n x n x n matmul on the default device (best of `repeats`)."""
    a = jnp.ones((n, n), dtype)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        f(a).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best


def cpu_theoretical_peak(lscpu_text: str | None = None) -> tuple[float, str]:
    """(float32 FLOP/s, how it was derived) of this machine's CPUs: cores x FLOP/cycle x clock.

    FLOP/cycle per core from the vector ISA in the flags, assuming two FMA units (server cores):
    AVX-512 64, AVX2+FMA 32, else SSE 8. Clock: `CPU max MHz`, else `CPU MHz`, else BogoMIPS / 2
    (x86 BogoMIPS is twice the TSC clock). lscpu_text: lscpu's output (read when None).
    """
    if lscpu_text is None:
        try:
            lscpu_text = subprocess.run(["lscpu"], capture_output=True, text=True,
                                        timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            lscpu_text = ""
    info = {}
    for line in lscpu_text.splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            info[k.strip()] = v.strip()
    cores = int(info.get("CPU(s)", "1") or 1)
    flags = set(info.get("Flags", "").split())
    if "avx512f" in flags:
        per_cycle, isa = 64, "AVX-512"
    elif {"avx2", "fma"} <= flags:
        per_cycle, isa = 32, "AVX2+FMA"
    else:
        per_cycle, isa = 8, "SSE"
    mhz = None
    for key in ("CPU max MHz", "CPU MHz"):
        if re.fullmatch(r"[0-9.]+", info.get(key, "")):
            mhz, src = float(info[key]), key
            break
    if mhz is None:
        bogo = info.get("BogoMIPS", "")
        mhz, src = (float(bogo) / 2, "BogoMIPS/2") if re.fullmatch(r"[0-9.]+", bogo) else (
            2000.0, "assumed 2 GHz")
    peak = cores * per_cycle * mhz * 1e6
    amx = ""
    if "amx_bf16" in flags:     # one AMX tile unit per core: 1024 bf16 FLOP/cycle (16x16x32 x2 / 16)
        amx = (f"; AMX-BF16 present: bf16 peak {cores * 1024 * mhz / 1e6:.2f} TFLOP/s "
               f"(cores x 1024 FLOP/cycle x clock)")
    return peak, (f"theoretical: {cores} cores x {per_cycle} f32 FLOP/cycle ({isa}, 2 FMA units) "
                  f"x {mhz / 1000:.2f} GHz ({src}){amx}")


def peak_flops_per_device() -> tuple[float, str]:
    """(peak FLOP/s per device, where it came from): the spec sheet of a known accelerator, else
    the CPU's theoretical peak (`cpu_theoretical_peak`, divided over the CPU devices)."""
    dev = jax.devices()[0]
    kind = getattr(dev, "device_kind", "")
    for key, val in _PEAK_BF16.items():
        if key.lower() in kind.lower():
            return val, f"spec sheet ({kind})"
    peak, src = cpu_theoretical_peak()
    n = max(len(jax.devices()), 1)
    return peak / n, src + (f" / {n} devices" if n > 1 else "")
