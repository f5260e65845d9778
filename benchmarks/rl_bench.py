"""rl_async vs rl_sync on the same settings, side by side in one run.

    python benchmarks/rl_bench.py [--steps 20] [--staleness 2] [--set rl.key=value ...] [--out DIR]

Both runs use the `rl_async` default config (the parity task family through the real engine
service, weight store and rl_step) with the same overrides; only rl.max_staleness differs (S for
async, 0 for sync). Each run's first two versions are warm-up (compilation) and are left out of the
rates. Reported per run: rollouts/s, trained tokens/s, trainer idle fraction (time waiting for a
batch / wall), engine idle fraction (time with no request in flight / wall), staleness, the reward
over the last versions, and the async/sync ratios. Results: OUT/rl_bench.json and a text table
(default OUT = benchmarks/results).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WARMUP = 2


def run_one(name: str, staleness: int, steps: int, overrides: list[str], workdir: pathlib.Path):
    from composer_jax import registry
    from composer_jax.config import SECTION_PRESETS
    from composer_jax.overrides import apply_overrides
    from composer_jax.rl.driver import run_rl, settings_from_config
    from experiments.rl import make_store, program_spec

    exp = registry.get("rl_async")
    cfg = apply_overrides(exp.make_config(), overrides + [f"rl.steps={steps}",
                                                          f"rl.max_staleness={staleness}",
                                                          "rl.eval_every=0"], SECTION_PRESETS)
    t0 = time.time()
    summary = run_rl(program_spec(cfg), workdir, settings_from_config(cfg, progress=False),
                     make_store(cfg))
    rows = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "reward_mean" in r]
    timed = [r for r in rows if r["step"] > WARMUP]
    span = timed[-1]["time"] - rows[WARMUP - 1]["time"]
    # rollouts finished and tokens trained inside the timed span
    trained = sum(r["trained_tokens"] for r in timed)
    n_rollouts = len(timed) * cfg.rl.batch_groups * cfg.rl.group_size
    idle = sum(r["trainer_idle_frac"] * r["step_time_s"] for r in timed) / max(
        sum(r["step_time_s"] for r in timed), 1e-9)
    last = rows[-min(5, len(rows)):]
    return {
        "name": name, "max_staleness": staleness, "steps": steps, "wall_s": time.time() - t0,
        "timed_versions": len(timed), "timed_s": span,
        "rollouts_per_sec": n_rollouts / span, "trained_tokens_per_sec": trained / span,
        "trainer_idle_frac": idle,
        "engine_idle_frac": summary["inference"].get("engine_idle_frac", float("nan")),
        "staleness_mean": sum(r["staleness_mean"] for r in timed) / len(timed),
        "staleness_max": max(r["staleness_max"] for r in timed),
        "reward_first5": sum(r["reward_mean"] for r in rows[:5]) / min(5, len(rows)),
        "reward_last5": sum(r["reward_mean"] for r in last) / len(last),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--staleness", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], dest="overrides")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()
    from absl import logging
    logging.set_verbosity(logging.WARNING)
    results = []
    with tempfile.TemporaryDirectory(prefix="rl_bench_") as tmp:
        for name, s in (("rl_sync", 0), ("rl_async", args.staleness)):
            results.append(run_one(name, s, args.steps, args.overrides, pathlib.Path(tmp) / name))
    sync, asyn = results
    ratio = {k: asyn[k] / max(sync[k], 1e-12) for k in ("rollouts_per_sec",
                                                         "trained_tokens_per_sec")}
    import platform
    import jax
    report = {"machine": f"{platform.node()} {jax.devices()[0].device_kind} x{jax.device_count()}",
              "overrides": args.overrides, "runs": results, "async_over_sync": ratio}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rl_bench.json").write_text(json.dumps(report, indent=1))
    keys = ["rollouts_per_sec", "trained_tokens_per_sec", "trainer_idle_frac", "engine_idle_frac",
            "staleness_mean", "staleness_max", "reward_first5", "reward_last5", "timed_s"]
    lines = [f"rl_bench: {report['machine']}; steps={args.steps} (first {WARMUP} = warm-up), "
             f"overrides={args.overrides}",
             f"{'metric':<24}{'rl_sync (S=0)':>16}{f'rl_async (S={args.staleness})':>18}"]
    for k in keys:
        lines.append(f"{k:<24}{sync[k]:>16.3f}{asyn[k]:>18.3f}")
    lines.append(f"async/sync rollouts/s = {ratio['rollouts_per_sec']:.2f}x, trained tokens/s = "
                 f"{ratio['trained_tokens_per_sec']:.2f}x")
    text = "\n".join(lines)
    (out / "rl_bench.txt").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
