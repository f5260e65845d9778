"""What bounding staleness at consumption costs: rl.stale_policy=drop vs keep, side by side.

    python benchmarks/rl_stale_bench.py [--steps 30] [--staleness 2] [--latency-scale 0.05]
                                        [--repeats 2] [--set rl.key=value ...]

Both runs use `rl_async_parity` with the environment-latency model (`rl/latency_model.py`, so
episodes finish out of order and stragglers exist) and the same S; only rl.stale_policy differs:
"drop" sets aside every group whose oldest token is more than S versions behind the trainer (and
frees its admission slot), "keep" trains it with the truncated IS correction. Runs alternate
keep, drop, drop, keep (ABBA). Reported: rollouts/s and trained tokens/s after warm-up, the
largest staleness trained, the groups dropped, and drop/keep ratios. Results:
benchmarks/results/rl_stale_policy.txt.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

KEYS = ("rollouts_per_sec", "trained_tokens_per_sec", "staleness_mean", "staleness_max",
        "stale_dropped_groups", "timed_s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--staleness", type=int, default=2)
    ap.add_argument("--latency-scale", type=float, default=0.05)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], dest="overrides")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()
    from absl import logging
    logging.set_verbosity(logging.WARNING)
    from rl_bench import run_one
    load0 = os.getloadavg()[0]
    order = ["keep", "drop"]
    order = [o for r in range(args.repeats) for o in (order if r % 2 == 0 else order[::-1])]
    runs = []
    with tempfile.TemporaryDirectory(prefix="rl_stale_") as tmp:
        for j, policy in enumerate(order):
            extra = [f"rl.task.env_latency_scale={args.latency_scale}", f"rl.stale_policy={policy}"]
            r = run_one(policy, args.staleness, args.steps, args.overrides + extra,
                        pathlib.Path(tmp) / f"{j}_{policy}")
            runs.append(r)
            print(policy, {k: round(r[k], 3) for k in KEYS}, flush=True)
    mean = {p: {k: sum(r[k] for r in runs if r["name"] == p) / args.repeats for k in KEYS}
            for p in ("keep", "drop")}
    for p in mean:
        mean[p]["staleness_max"] = max(r["staleness_max"] for r in runs if r["name"] == p)
    lines = [f"rl_stale_bench: rl_async_parity, S={args.staleness}, latency model x"
             f"{args.latency_scale}, {args.steps} versions per run (first 2 = warm-up), "
             f"repeats={args.repeats} (order keep/drop/drop/keep); overrides={args.overrides}; "
             f"1-min load average at start {load0:.1f}, at end {os.getloadavg()[0]:.1f} (2 cores)",
             "", f"{'metric':<24}{'keep':>12}{'drop':>12}{'drop/keep':>12}"]
    for k in KEYS:
        a, b = mean["keep"][k], mean["drop"][k]
        lines.append(f"{k:<24}{a:>12.3f}{b:>12.3f}{(b / a if a else float('nan')):>12.3f}")
    lines += ["", "per run: " + "; ".join(
        f"{r['name']}: {r['rollouts_per_sec']:.2f} rollouts/s, staleness_max "
        f"{r['staleness_max']:.0f}, dropped {r['stale_dropped_groups']:.0f}" for r in runs)]
    text = "\n".join(lines)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rl_stale_policy.txt").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
