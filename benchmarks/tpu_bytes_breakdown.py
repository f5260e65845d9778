"""Where two compiled train steps' `bytes accessed` go, op class by op class (issue 44).

    python benchmarks/tpu_bytes_breakdown.py OURS_HLO MAXTEXT_HLO [--top 30]
    python benchmarks/tpu_bytes_breakdown.py --loop_check      # how XLA:TPU counts a while loop

OURS_HLO / MAXTEXT_HLO: the `*after_optimizations.txt` dumps of the two steps
(`XLA_FLAGS="--xla_dump_to=DIR --xla_dump_hlo_as_text"` around
`python3 ../shared/anchors/tpu_side_by_side.py`). Each op is charged with its estimated bytes
(composer_jax.parallel.hlo_bytes) once per loop body, as XLA:TPU's cost analysis counts them
(`--loop_check` compiles a loop of 4 and of 16 iterations of the same body for v6e and prints
equal bytes). Prints the totals by loop level, by (phase, op class), and the largest ops.

`--loop_check` and the ragged-dot check (`--ragged_check`) need libtpu (the project venv with
the tpu extra); the breakdown itself is text processing.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys

from composer_jax.parallel.hlo_bytes import op_bytes


def once(rows: list[dict], key) -> collections.Counter:
    """Bytes per key(row), each op counted once (its loops' trip counts divided out)."""
    c: collections.Counter = collections.Counter()
    for r in rows:
        c[key(r)] += r["bytes"] // r["trips"]
    return c


def level(r: dict) -> str:
    """'layer loop' for ops inside a scan over layers (trip count > 8, and the loops nested in
    it), else 'outside'."""
    return "layer loop" if r["loops"] and r["loops"][0] > 8 else "outside"


def side_by_side(a: collections.Counter, b: collections.Counter, top: int) -> list[str]:
    keys = sorted(set(a) | set(b), key=lambda k: -max(a[k], b[k]))[:top]
    out = [f"{'ours GB':>9s} {'MaxText':>9s} {'diff':>8s}  what"]
    for k in keys:
        name = " | ".join(k) if isinstance(k, tuple) else str(k)
        out.append(f"{a[k] / 1e9:9.3f} {b[k] / 1e9:9.3f} {(a[k] - b[k]) / 1e9:+8.3f}  {name}")
    out.append(f"{sum(a.values()) / 1e9:9.3f} {sum(b.values()) / 1e9:9.3f} "
               f"{(sum(a.values()) - sum(b.values())) / 1e9:+8.3f}  all (estimate)")
    return out


def largest(rows: list[dict], top: int) -> list[str]:
    rows = sorted(rows, key=lambda r: -r["bytes"] // r["trips"])[:top]
    return [f"{r['bytes'] // r['trips'] / 1e9:7.3f} {level(r):10s} {r['phase'][:9]:9s} "
            f"{r['category'][:24]:24s} {r['shape'][:56]:56s} {r['source'][:44]}" for r in rows]


def _tpu_device(topology: str = "v6e:1x1"):
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    import jax
    jax.config.update("jax_platforms", "cpu")
    from jax.experimental import topologies
    from jax.sharding import SingleDeviceSharding
    dev = topologies.get_topology_desc(topology_name=topology, platform="tpu").devices[0]
    return SingleDeviceSharding(dev)


def _bytes(fn, *args) -> float:
    import jax
    ca = jax.jit(fn).lower(*args).compile().cost_analysis()
    ca = ca[0] if isinstance(ca, (list, tuple)) else ca
    return float(ca["bytes accessed"])


def loop_check() -> list[str]:
    """XLA:TPU's bytes accessed of one body, and of loops of 1, 4 and 16 iterations of it."""
    import jax
    import jax.numpy as jnp
    x = jax.ShapeDtypeStruct((1024, 1024), jnp.float32, sharding=_tpu_device())

    def loop(n):
        return lambda x: jax.lax.fori_loop(0, n, lambda i, y: jnp.sin(y) * 2, x)
    out = [f"body alone          {_bytes(lambda x: jnp.sin(x) * 2, x) / 2**20:8.2f} MiB"]
    out += [f"fori_loop of {n:2d}     {_bytes(loop(n), x) / 2**20:8.2f} MiB" for n in (1, 4, 16)]
    return out


def ragged_check() -> list[str]:
    """XLA:TPU's bytes accessed of one MoE-sized ragged dot and of its weight gradient, with a
    float32 result cast to bf16 and with a bf16 result."""
    import jax
    import jax.numpy as jnp
    sh = _tpu_device()
    m, k, n, e = 32768, 2048, 1024, 64
    x = jax.ShapeDtypeStruct((m, k), jnp.bfloat16, sharding=sh)
    w = jax.ShapeDtypeStruct((e, k, n), jnp.bfloat16, sharding=sh)
    gs = jax.ShapeDtypeStruct((e,), jnp.int32, sharding=sh)
    dy = jax.ShapeDtypeStruct((m, n), jnp.bfloat16, sharding=sh)

    def fwd(pet):
        return lambda x, w, g: jax.lax.ragged_dot(x, w, g, preferred_element_type=pet).astype(
            jnp.bfloat16)

    def dw(pet):
        return lambda x, w, g, dy: jax.linear_transpose(lambda w: fwd(pet)(x, w, g), w)(dy)[0]
    out = [f"[{m},{k}] x [{e},{k},{n}] bf16"]
    for name, pet in (("float32 result, cast", jnp.float32), ("bf16 result", jnp.bfloat16)):
        out.append(f"{name:22s} forward {_bytes(fwd(pet), x, w, gs) / 1e9:6.3f} GB, weight "
                   f"gradient {_bytes(dw(pet), x, w, gs, dy) / 1e9:6.3f} GB")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ours", nargs="?")
    ap.add_argument("maxtext", nargs="?")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--loop_check", action="store_true")
    ap.add_argument("--ragged_check", action="store_true")
    a = ap.parse_args()
    if a.loop_check:
        print("\n".join(loop_check()))
    if a.ragged_check:
        print("\n".join(ragged_check()))
    if not (a.ours and a.maxtext):
        return
    ours = op_bytes(open(a.ours).read())
    mt = op_bytes(open(a.maxtext).read())
    print("== by loop level (each loop body once)")
    print("\n".join(side_by_side(once(ours, lambda r: (level(r),)),
                                 once(mt, lambda r: (level(r),)), a.top)))
    for lv in ("layer loop", "outside"):
        print(f"\n== {lv}: by phase and op class")
        pick = (lambda r, lv=lv: (r["phase"], r["category"]) if level(r) == lv else None)
        ca, cb = once(ours, pick), once(mt, pick)
        ca.pop(None, None)
        cb.pop(None, None)
        print("\n".join(side_by_side(ca, cb, a.top)))
    for name, rows in (("ours", ours), ("MaxText", mt)):
        print(f"\n== {name}: largest ops (GB once, level, phase, class, shape, source)")
        print("\n".join(largest(rows, a.top)))


if __name__ == "__main__":
    sys.exit(main())
