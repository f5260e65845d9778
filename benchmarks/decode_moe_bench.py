"""The decode MoE's two exact forms side by side: gathered expert rows against the 16-row blocked
layout (`composer_jax.inference.moe`), per token count, for the expert shapes of `cpt_debug` and
`small`. The ratio gather / blocked says where `dispatch_path` should switch.

    PYTHONPATH=$PWD python benchmarks/decode_moe_bench.py   # writes results/decode_moe_bench.txt
"""
from __future__ import annotations

import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from composer_jax.inference.moe import dispatch_path, experts_blocked, experts_gather  # noqa: E402

from machine_load import uptime  # noqa: E402  (benchmarks/machine_load.py)

OUT = pathlib.Path(__file__).resolve().parent / "results" / "decode_moe_bench.txt"
SHAPES = {"cpt_debug": (8, 2, 96, 64), "small": (32, 4, 256, 128)}     # E, K, D, F
TOKENS = (1, 2, 3, 4, 6, 8, 16, 32)


def best_us(fn, args, calls: int = 200, rounds: int = 5) -> float:
    """The fastest mean microseconds per call over `rounds` rounds of `calls` calls (compiled)."""
    fn(*args).block_until_ready()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            r = fn(*args)
        r.block_until_ready()
        times.append((time.perf_counter() - t0) / calls)
    return min(times) * 1e6


def main() -> None:
    lines = [f"# benchmarks/decode_moe_bench.py — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"jax {jax.__version__}, cpu x{os.cpu_count()} cores, float32, random routing "
             f"(K distinct experts per token); fastest of 5 rounds of 200 calls",
             f"# load at start: {uptime()}",
             f"{'shape':<10} {'E':>3} {'K':>2} {'N':>3} {'N*K':>4} {'gather_us':>10} "
             f"{'blocked_us':>10} {'gather/blocked':>14} {'path':>8}"]
    print("\n".join(lines), flush=True)
    gather = jax.jit(lambda *a: experts_gather(*a, jnp.float32))
    blocked = jax.jit(lambda *a: experts_blocked(*a, jnp.float32))
    for name, (e, k, d, f) in SHAPES.items():
        rng = np.random.default_rng(0)
        w = [jnp.asarray(rng.normal(size=s), jnp.float32) for s in ((e, d, f), (e, d, f), (e, f, d))]
        for n in TOKENS:
            x = jnp.asarray(rng.normal(size=(n, d)), jnp.float32)
            idx = jnp.asarray(np.stack([rng.choice(e, k, replace=False) for _ in range(n)]),
                              jnp.int32)
            args = (x, idx, jnp.full((n, k), 1.0 / k, jnp.float32), *w)
            tg, tb = best_us(gather, args), best_us(blocked, args)
            line = (f"{name:<10} {e:>3} {k:>2} {n:>3} {n * k:>4} {tg:>10.1f} {tb:>10.1f} "
                    f"{tg / tb:>14.2f} {dispatch_path(n, k, e):>8}")
            lines.append(line)
            print(line, flush=True)
    lines.append(f"# load at end: {uptime()}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
