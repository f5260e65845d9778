"""rl_async vs rl_sync on the same settings, side by side in one run.

    python benchmarks/rl_bench.py [--steps 40] [--staleness 2] [--latency-scale 0.05]
                                  [--repeats 2] [--set rl.key=value ...] [--out DIR]

Both runs of a pair use the `rl_async_parity` config (the parity task family through the real
engine service, weight store and rl_step) with the same overrides; only rl.max_staleness differs
(S for async, 0 for sync). Two pairs:

- "no env latency": the parity tasks as they are (one engine request + a rule grade per episode).
  There is nothing to overlap but the trainer with the engine, and on a CPU machine those share
  the same cores, so the gain is small by construction.
- "env latency model": every episode also spends environment time drawn from measured sandboxed
  episodes (`composer_jax/rl/latency_model.py`: wall times of 160 real sandbox episodes with real
  tools, times `--latency-scale`), half before and half after its reply, on the rollout worker.
  This is a latency MODEL standing in for tool calls and test runs, not the coding environment.

Each setting runs `--repeats` times in the order sync, async, async, sync (so load drift on a
shared machine biases neither side); the table gives means. Each run's first two versions are warm-up (compilation) and are left out of the rates. Reported per
run: rollouts/s, trained tokens/s, trainer idle fraction (time waiting for a batch / wall), engine
idle fraction (time with no request in flight / wall), staleness, the reward over the first and
last versions, and the async/sync ratios. Results: OUT/rl_bench.{json,txt,png} (reward against
version and against wall time; default OUT = benchmarks/results).
"""
from __future__ import annotations

import argparse
import json
import os
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
    from composer_jax.rl.task_program import task_program_spec
    from experiments.rl import make_store

    exp = registry.get("rl_async_parity")
    cfg = apply_overrides(exp.make_config(), overrides + [f"rl.steps={steps}",
                                                          f"rl.max_staleness={staleness}",
                                                          "rl.job.eval_every=0"], SECTION_PRESETS,
                          rebase=exp.rebase)
    t0 = time.time()
    summary = run_rl(task_program_spec(cfg), workdir, settings_from_config(cfg, progress=False),
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
        "stale_dropped_groups": float(summary.get("stale_dropped_groups", 0)),
        "reward_first5": sum(r["reward_mean"] for r in rows[:5]) / min(5, len(rows)),
        "reward_last5": sum(r["reward_mean"] for r in last) / len(last),
        "curve": [{"version": r["step"], "reward_mean": r["reward_mean"],
                   "time_s": r["time"] - rows[0]["time"]} for r in rows],
    }


def _mean(runs: list[dict]) -> dict:
    """The mean of each number over repeated runs of one setting (curves: the first run's)."""
    out = dict(runs[0])
    for k in KEYS:
        out[k] = sum(r[k] for r in runs) / len(runs)
    out["staleness_max"] = max(r["staleness_max"] for r in runs)
    out["repeats"] = len(runs)
    return out


KEYS = ["rollouts_per_sec", "trained_tokens_per_sec", "trainer_idle_frac", "engine_idle_frac",
        "staleness_mean", "staleness_max", "reward_first5", "reward_last5", "timed_s"]


def _table(title: str, sync: dict, asyn: dict, staleness: int) -> list[str]:
    ratio = {k: asyn[k] / max(sync[k], 1e-12) for k in ("rollouts_per_sec",
                                                         "trained_tokens_per_sec")}
    lines = [title, f"{'metric':<24}{'rl_sync (S=0)':>16}{f'rl_async (S={staleness})':>18}"]
    lines += [f"{k:<24}{sync[k]:>16.3f}{asyn[k]:>18.3f}" for k in KEYS]
    lines.append(f"async/sync rollouts/s = {ratio['rollouts_per_sec']:.2f}x, trained tokens/s = "
                 f"{ratio['trained_tokens_per_sec']:.2f}x (means over {sync.get('repeats', 1)} "
                 f"runs each, order sync/async/async/sync...)")
    return lines


def _plot(pairs: list[dict], path: pathlib.Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(pairs), 2, figsize=(10, 3.2 * len(pairs)), squeeze=False)
    for row, pair in zip(axes, pairs):
        for run in pair["runs"]:
            v = [c["version"] for c in run["curve"]]
            t = [c["time_s"] for c in run["curve"]]
            r = [c["reward_mean"] for c in run["curve"]]
            label = f"{run['name']} (S={run['max_staleness']})"
            row[0].plot(v, r, label=label)
            row[1].plot(t, r, label=label)
        row[0].set_xlabel("version")
        row[1].set_xlabel("wall seconds")
        for ax in row:
            ax.set_ylabel("reward_mean")
            ax.set_title(pair["title"].split(":")[0], fontsize=9)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--staleness", type=int, default=2)
    ap.add_argument("--latency-scale", type=float, default=0.05,
                    help="x measured sandbox episode seconds (rl/latency_model.py); 0 skips the "
                         "latency-model pair")
    ap.add_argument("--no-plain", action="store_true", help="skip the no-env-latency pair")
    ap.add_argument("--repeats", type=int, default=2,
                    help="runs of each setting, in the order sync, async, async, sync, ...")
    ap.add_argument("--set", action="append", default=[], dest="overrides")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()
    from absl import logging
    logging.set_verbosity(logging.WARNING)
    from composer_jax.rl.latency_model import summary as latency_summary
    variants = []
    if not args.no_plain:
        variants.append(("no env latency (parity tasks as they are)", []))
    if args.latency_scale > 0:
        lat = latency_summary(args.latency_scale)
        variants.append((
            f"env LATENCY MODEL: per-episode env time = {args.latency_scale} x a measured sandbox "
            f"episode (n={lat['n']}; mean {lat['mean_s']:.3f} s, median {lat['median_s']:.3f} s, "
            f"p90 {lat['p90_s']:.3f} s, max {lat['max_s']:.3f} s)",
            [f"rl.task.env_latency_scale={args.latency_scale}"]))
    load0 = os.getloadavg()[0]
    pairs = []
    # order sync, async, async, sync, ... (ABBA): a machine whose load drifts during the bench
    # biases neither side; the table shows the mean over repeats, the JSON every run
    order = [("rl_sync", 0), ("rl_async", args.staleness)]
    order = [o for r in range(args.repeats) for o in (order if r % 2 == 0 else order[::-1])]
    with tempfile.TemporaryDirectory(prefix="rl_bench_") as tmp:
        for i, (title, extra) in enumerate(variants):
            each = [run_one(name, s, args.steps, args.overrides + extra,
                            pathlib.Path(tmp) / f"{i}_{j}_{name}")
                    for j, (name, s) in enumerate(order)]
            runs = [_mean([r for r in each if r["name"] == name]) for name, _ in order[:2]]
            ratio = {k: runs[1][k] / max(runs[0][k], 1e-12)
                     for k in ("rollouts_per_sec", "trained_tokens_per_sec")}
            ratio["per_repeat_rollouts_per_sec"] = [
                a["rollouts_per_sec"] / b["rollouts_per_sec"] for a, b in zip(
                    [r for r in each if r["name"] == "rl_async"],
                    [r for r in each if r["name"] == "rl_sync"])]
            pairs.append({"title": title, "overrides": args.overrides + extra, "runs": runs,
                          "all_runs": each, "async_over_sync": ratio})
    import platform
    import jax
    machine = f"{platform.node()} {jax.devices()[0].device_kind} x{jax.device_count()}, " \
              f"{os.cpu_count()} CPUs"
    report = {"machine": machine, "steps": args.steps, "warmup_versions": WARMUP,
              "latency_model": (latency_summary(args.latency_scale)
                                if args.latency_scale > 0 else None),
              "pairs": pairs}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rl_bench.json").write_text(json.dumps(report, indent=1))
    lines = [f"rl_bench: {machine}; steps={args.steps} per run (first {WARMUP} = warm-up); "
             f"repeats={args.repeats}; overrides={args.overrides}; 1-min load average at start "
             f"{load0:.1f}, at end {os.getloadavg()[0]:.1f}", ""]
    for pair in pairs:
        lines += _table(pair["title"], *pair["runs"], args.staleness)
        lines += ["per repeat async/sync rollouts/s: " + ", ".join(
            f"{x:.2f}x" for x in pair["async_over_sync"]["per_repeat_rollouts_per_sec"]), ""]
    text = "\n".join(lines)
    (out / "rl_bench.txt").write_text(text)
    _plot(pairs, out / "rl_bench.png")
    print(text)


if __name__ == "__main__":
    main()
