"""The README's main command, timed and summarised into benchmarks/results/rl_async_default.{txt,json}.

    python benchmarks/rl_async_default.py [--workdir=runs/rl_async_default]

Runs `python launch.py --experiment=rl_async --workdir=WORKDIR` in a fresh WORKDIR (the README's
main command, CPU default), then writes from the run's own outputs (rl_summary.json and
metrics.jsonl): wall time of the command, versions, rollouts, the training reward over the first
and last 5 versions, the held-out evaluations, the staleness histogram, the machine load, and a
per-10-versions table. The README quotes these files.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default="runs/rl_async_default")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "rl_async_default"))
    args = ap.parse_args()
    work = pathlib.Path(args.workdir).absolute()
    if work.exists():
        shutil.rmtree(work)
    cmd = [sys.executable, str(ROOT / "launch.py"), "--experiment=rl_async", f"--workdir={work}"]
    load_before = os.getloadavg()[0]
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        print(f"the run failed with exit status {p.returncode}", file=sys.stderr)
        return p.returncode
    from composer_jax.rl.run_report import reward_first_last
    from composer_jax.runlog import read_metrics
    s = json.loads((work / "rl_summary.json").read_text())
    rows = read_metrics(work)
    (a0, a1, ra), (b0, b1, rb) = reward_first_last(rows)
    load_after = os.getloadavg()[0]
    result = {
        "command": f"python launch.py --experiment=rl_async --workdir={args.workdir}",
        "written_by": "python benchmarks/rl_async_default.py",
        "wall_s": round(wall, 1), "run_elapsed_s": round(s["elapsed_s"], 1),
        "versions": s["version"], "rollouts_finished": s["rollouts_finished"],
        "rollouts_per_sec": round(s["rollouts_per_sec"], 1),
        "train_reward_first": round(ra, 3), "train_reward_first_versions": [a0, a1],
        "train_reward_last": round(rb, 3), "train_reward_last_versions": [b0, b1],
        "eval": {v: {k: round(x, 3) for k, x in e.items() if isinstance(x, float)}
                 for v, e in s["eval"].items()},
        "staleness_hist": s["staleness_hist"],
        "load_average_1min": [round(load_before, 1), round(load_after, 1)],
        "cpus": os.cpu_count(),
    }
    out = pathlib.Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    def _eval(v: str, e: dict) -> str:
        """One evaluation: resolved rate +- SE and the reward (lookup: eval_reward_mean; the
        parity family's rows name it heldout_parity_reward_mean)."""
        reward = e.get("eval_reward_mean", e.get("heldout_parity_reward_mean", float("nan")))
        se = e.get("eval_resolved_se")
        resolved = f"{e.get('eval_resolved_rate', float('nan')):.3f}" + (
            f" +- {se:.3f}" if se is not None else "")
        return f"v{v}: held-out resolved {resolved}, reward {reward:.3f}"

    ev = ", ".join(_eval(v, e) for v, e in sorted(result["eval"].items(),
                                                     key=lambda kv: int(kv[0])))
    lines = [
        f"# written by: {result['written_by']} --workdir={args.workdir} (runs the README main "
        f"command with that workdir: {result['command']})",
        f"# {result['cpus']} CPUs, 1-min load average {result['load_average_1min'][0]} before, "
        f"{result['load_average_1min'][1]} after",
        f"# wall time of the command: {result['wall_s']} s (the run's own elapsed_s: "
        f"{result['run_elapsed_s']} s); {result['versions']} versions, "
        f"{result['rollouts_finished']} rollouts, {result['rollouts_per_sec']} rollouts/s",
        f"# train reward_mean: {result['train_reward_first']} (versions {a0}-{a1}) -> "
        f"{result['train_reward_last']} (versions {b0}-{b1})",
        f"# eval (held-out tasks, greedy): {ev}",
        f"# staleness histogram: {result['staleness_hist']}",
        "version\treward_mean\tresolved_rate\tentropy\tstaleness_mean\tweight_sync_ratio\t"
        "trainer_idle_frac",
    ]
    train = [r for r in rows if "reward_mean" in r]
    for r in train:
        if r["step"] % 10 == 1 or r["step"] == train[-1]["step"]:
            lines.append("\t".join([str(r["step"])] + [
                f"{r.get(k, float('nan')):.3f}" for k in ("reward_mean", "resolved_rate",
                                                          "entropy", "staleness_mean",
                                                          "weight_sync_ratio",
                                                          "trainer_idle_frac")]))
    out.with_suffix(".txt").write_text("\n".join(lines) + "\n")
    shutil.copyfile(work / "plots" / "reward.png", out.parent / "rl_async_reward.png")
    print("\n".join(lines[:6]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
