"""Rollouts/s of the main job (`launch.py --experiment=rl_async`, the lookup family) under both
schedules, side by side in one process on one machine, and whether two reproducible runs are the
same run (`rl/run_compare.py`):

    python benchmarks/rl_schedule_throughput.py [--steps 6] [--rounds 2]

Each run trains `--steps` versions without held-out evaluation (rl.job.eval_every=0), so the time
is rollouts and training; rollouts/s is measured from the version-2 row to the last (compilation
and the first batch excluded) and over the whole run (rl_summary.json). The schedules alternate
(--rounds pairs: free_running, reproducible, ...), so drift of the machine's load hits both. Writes benchmarks/results/rl_schedule_throughput.txt."""
from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from composer_jax.rl.run_compare import compare_runs  # noqa: E402


def run(workdir: pathlib.Path, schedule: str, steps: int) -> dict:
    cmd = [sys.executable, str(ROOT / "launch.py"), "--experiment=rl_async",
           f"--workdir={workdir}", "--set", f"rl.steps={steps}", "--set", "rl.job.eval_every=0",
           "--set", f"rl.schedule={schedule}"]
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        raise SystemExit(f"{schedule} run failed:\n{p.stderr[-3000:]}")
    rows = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "reward_mean" in r]
    cfg = json.loads((workdir / "config.json").read_text())["rl"]
    per_step = cfg["batch_groups"] * cfg["group_size"]
    steady = per_step * (len(train) - 2) / (train[-1]["time"] - train[1]["time"])
    s = json.loads((workdir / "rl_summary.json").read_text())
    return {"schedule": schedule, "steady_rollouts_per_sec": steady,
            "run_rollouts_per_sec": s["rollouts_per_sec"], "wall_s": wall,
            "staleness_mean": sum(r["staleness_mean"] for r in train) / len(train),
            "reward_last": train[-1]["reward_mean"], "idle": s["trainer_idle_frac"]}


def main(argv=None) -> str:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="rl_sched_"))
    try:
        plan = [(tmp / f"{sch}_{i}", sch) for i in range(args.rounds)
                for sch in ("free_running", "reproducible")]
        res = [run(d, sch, args.steps) for d, sch in plan]
        repro = [d for d, sch in plan if sch == "reproducible"]
        diffs = compare_runs(repro[0], repro[1]) if len(repro) > 1 else ["only one run"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    lines = [f"rl_async (lookup, 4 groups x 8 samples per step, 32 rollout workers, "
             f"rl.max_staleness=2), {args.steps} versions, rl.job.eval_every=0; one machine, "
             f"runs in sequence; command: python benchmarks/rl_schedule_throughput.py "
             f"--steps {args.steps} --rounds {args.rounds}"]
    for sch in ("free_running", "reproducible"):
        xs = [r["steady_rollouts_per_sec"] for r in res if r["schedule"] == sch]
        lines.append(f"{sch:13s} mean rollouts/s (versions 2..{args.steps}) over {len(xs)} runs: "
                     f"{sum(xs) / len(xs):6.2f}")
    for r in res:
        lines.append(f"{r['schedule']:13s} rollouts/s {r['steady_rollouts_per_sec']:6.2f} "
                     f"(versions 2..{args.steps}), {r['run_rollouts_per_sec']:6.2f} (whole run), "
                     f"wall {r['wall_s']:6.1f} s, staleness mean {r['staleness_mean']:.2f}, "
                     f"trainer idle {r['idle']:.2f}, last reward {r['reward_last']:.3f}")
    lines.append("two reproducible runs: " + ("identical (metrics without wall-clock fields, "
                                              "consumed log, final checkpoint arrays)"
                                              if not diffs else f"DIFFER: {diffs[:5]}"))
    text = "\n".join(lines) + "\n"
    out = ROOT / "benchmarks" / "results" / "rl_schedule_throughput.txt"
    out.write_text(text)
    return text


if __name__ == "__main__":
    print(main())
