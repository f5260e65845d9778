"""GPU benchmark: the Pallas block-scaled kernels vs jnp.dot in bf16 and fp8.

Times quantize (MXFP8, NVFP4), block-scaled matmul (MXFP8, NVFP4) and the grouped matmul at a
few shapes, prints TFLOP/s (GB/s for quantize) and the ratio to jnp.dot, and writes the table to
benchmarks/results/quant_kernels_gpu.txt. Without a CUDA device it prints a message and exits 0.
Matmuls run in the "hopper" variant (Triton) everywhere and, on a tcgen05 GPU (compute capability
10.x: B200/GB200/B300), also in the "blackwell" variant (native block-scaled MMA, Mosaic GPU). Every
matmul row carries its max error relative to the reference numerics (composer_jax.quant.blockwise),
dense/grouped, as the on-hardware correctness check (the blackwell variant cannot run on CPU, so
this is where it is validated).

  python benchmarks/quant_kernels_gpu.py [--iters 20]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULT = ROOT / "benchmarks" / "results" / "quant_kernels_gpu.txt"
SHAPES = [(4096, 4096, 4096), (8192, 7168, 2048), (16384, 2048, 7168)]


def _cuda_available() -> bool:
    import jax

    try:
        return any(d.platform == "gpu" for d in jax.devices())
    except RuntimeError:
        return False


def _tcgen05() -> bool:
    import jax

    return str(getattr(jax.devices()[0], "compute_capability", "")).split(".")[0] in ("10", "11")


def _rel_err(got, want) -> float:
    import jax.numpy as jnp

    return float(jnp.max(jnp.abs(got - want)) / jnp.max(jnp.abs(want)))


def _time(fn, *args, iters: int) -> float:
    """Median seconds per call of a jitted fn (after one warm-up/compile call)."""
    import jax

    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def _rows(m: int, k: int, n: int, iters: int):
    import jax
    import jax.numpy as jnp

    import pallas_kernels as pk
    from composer_jax.quant import blockwise, quantize

    ka, kb = jax.random.split(jax.random.PRNGKey(0))
    a = jax.random.normal(ka, (m, k), jnp.bfloat16)
    b = jax.random.normal(kb, (k, n), jnp.bfloat16)
    flops = 2.0 * m * k * n
    dot_bf16 = _time(jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32)), a, b, iters=iters)
    a8, b8 = a.astype(jnp.float8_e4m3fn), b.astype(jnp.float8_e4m3fn)
    dot_fp8 = _time(jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32)), a8, b8, iters=iters)
    rows = [("jnp.dot bf16", dot_bf16, flops), ("jnp.dot fp8", dot_fp8, flops)]
    variants = ["hopper"] + (["blackwell"] if _tcgen05() else [])
    for fmt, kind in (("mxfp8", "e8m0"), ("nvfp4", "e4m3")):
        qa, qb = quantize(a, fmt, axis=-1), quantize(b, fmt, axis=0)
        sa = qa.scales.view(jnp.uint8) if kind == "e8m0" else qa.scales
        sb = qb.scales.view(jnp.uint8) if kind == "e8m0" else qb.scales
        da, db = qa.data.astype(jnp.float8_e4m3fn), qb.data.astype(jnp.float8_e4m3fn)
        g = None if qa.global_scale is None else qa.global_scale * qb.global_scale
        groups = 8
        wg = jnp.broadcast_to(db[None], (groups, k, n))
        swg = jnp.broadcast_to(sb[None], (groups,) + sb.shape)
        gs = jnp.full((groups,), m // groups, jnp.int32)
        want = blockwise.block_scaled_matmul(qa, qb)   # the reference numerics
        for variant in variants:
            mm = jax.jit(lambda *o, bs=qa.block_size, kd=kind, v=variant: pk.block_scaled_matmul(
                *o, block_size=bs, scale_kind=kd, variant=v, interpret=False))
            gmm = jax.jit(lambda *o, bs=qa.block_size, kd=kind, v=variant: pk.grouped_block_scaled_matmul(
                *o, block_size=bs, scale_kind=kd, variant=v, interpret=False))
            # every variant against the reference (same weights in every group: grouped == dense)
            note = (f" err {_rel_err(mm(da, sa, db, sb, g), want):.1e}"
                    f"/{_rel_err(gmm(da, sa, wg, swg, gs, g), want):.1e}")
            rows.append((f"block_scaled_matmul {fmt} {variant}{note}", _time(mm, da, sa, db, sb, g, iters=iters), flops))
            rows.append((f"grouped_matmul {fmt} G={groups} {variant}", _time(gmm, da, sa, wg, swg, gs, g, iters=iters), flops))
    q_mx = jax.jit(lambda x: pk.quantize_mxfp8(x, variant="hopper", interpret=False))
    q_nv = jax.jit(lambda x: pk.quantize_nvfp4(x, jnp.float32(1.0), variant="hopper", interpret=False))
    rows.append(("quantize_mxfp8", _time(q_mx, a, iters=iters), None))
    rows.append(("quantize_nvfp4", _time(q_nv, a, iters=iters), None))
    return rows, dot_bf16, a.size * 2 + a.size


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args(argv)
    if not _cuda_available():
        print("quant_kernels_gpu: no CUDA device found; skipping (nothing measured, no file written).")
        return 0
    import jax

    lines = [f"device: {jax.devices()[0].device_kind}; median of {args.iters} timed calls"]
    for m, k, n in SHAPES:
        rows, ref, qbytes = _rows(m, k, n, args.iters)
        lines.append(f"\nM={m} K={k} N={n}")
        lines.append(f"{'kernel':58s} {'ms':>9s} {'TFLOP/s':>9s} {'vs bf16 dot':>12s}")
        for name, sec, flops in rows:
            rate = f"{flops / sec / 1e12:9.1f}" if flops else f"{qbytes / sec / 1e9:6.0f}GB/s"
            lines.append(f"{name:58s} {sec * 1e3:9.3f} {rate:>9s} {ref / sec:11.2f}x")
    text = "\n".join(lines)
    print(text)
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(text + "\n")
    print(f"wrote {RESULT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
