"""Difficulty-aware length penalty: trained episodes get shorter on easy tasks and not on hard ones.

    python benchmarks/rl_length.py [--workdir runs/rl_length] [--set k=v ...]

Runs `launch.py --experiment=rl_async` on the lookup family with the level stated in the prompt
(`rl.task=composer_jax.rl.tasks.lookup_levels`, both levels: easy = read one note, hard = follow a
pointer to a second note) and the difficulty-aware length term (`rl.task.length_weights=1,0`:
0.01 x C(generated tokens) on easy tasks, nothing on hard ones; `--set rl.task.length_weights=3,0`
weighs it more). The SFT demonstrations open with a random preamble (none, 5 or
11 tokens), so the initial policy spends tokens it does not need. From the run's training metrics
(T = 1 samples of every version): generated tokens per episode on each level over the first and
the last `--window` versions (mean +- SE over those versions; z = change / sqrt(SE1^2 + SE2^2)),
the same for the resolved rate, and the held-out evaluations' per-level numbers (first and last
evaluation, mean +- SE over the held-out episodes of that level, with the read_file calls per
episode). `--set rl.task.verify=0.5 --set rl.seq_len=256` makes the extra length useful on hard
tasks only (a re-read of the last note; `rl/tasks/lookup_levels.py`), and `--set rl.task.draft_shown=marked`
labels the draft read (the design that shows the result: run M1 in the results file).
Results: benchmarks/results/rl_length.txt.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULTS = ["rl.task=composer_jax.rl.tasks.lookup_levels", "rl.task.levels=easy,hard",
            "rl.task.length_weights=1,0"]


def _stats(values: list[float]) -> tuple[float, float]:
    n = len(values)
    m = sum(values) / n
    var = sum((v - m) ** 2 for v in values) / max(n - 1, 1)
    return m, math.sqrt(var / n)


def _eval_lines(work: pathlib.Path) -> list[str]:
    """Per-level generated tokens and resolved rate of the first and the last checkpoint on the
    run's held-out split (`benchmarks/rl_summarize.heldout_rollouts`: every held-out task once,
    sampled at T=1 with the same seed per task for both versions; mean +- SE over episodes)."""
    from benchmarks.rl_summarize import heldout_rollouts
    from composer_jax.train.run_checkpoint import checkpoint_steps
    steps = checkpoint_steps(str(work))
    a, b = (heldout_rollouts(work, v, None) for v in (steps[0], steps[-1]))
    out = ["", f"held-out split, checkpoint {steps[0]} vs {steps[-1]} (mean +- SE over episodes)"]
    for level in ("easy", "hard"):
        for metric, of in (("generated_tokens_mean", lambda r: r.info["generated_tokens"]),
                           ("resolved_rate", lambda r: float(r.reward.get("resolved", 0.0))),
                           ("read_calls_mean", lambda r: len(r.info.get("reads", [])))):
            x, sx = _stats([of(r) for r in a if r.info.get("level") == level])
            y, sy = _stats([of(r) for r in b if r.info.get("level") == level])
            z = (y - x) / math.hypot(sx, sy) if math.hypot(sx, sy) > 0 else float("nan")
            out.append(f"{level:<6}{metric:<24}{x:>9.2f}+-{sx:<5.2f}{y:>9.2f}+-{sy:<5.2f}"
                       f"{y - x:>+10.2f}{z:>7.1f}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", default=str(ROOT / "runs" / "rl_length"))
    ap.add_argument("--window", type=int, default=5)
    ap.add_argument("--set", action="append", default=[], dest="overrides")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--no-train", action="store_true",
                    help="score the finished run in --workdir (made by the same command)")
    ap.add_argument("--append", action="store_true",
                    help="append to rl_length.txt instead of replacing it")
    args = ap.parse_args()
    work = pathlib.Path(args.workdir)
    sets = [x for o in DEFAULTS + args.overrides for x in ("--set", o)]
    load0 = os.getloadavg()[0]
    cmd = [sys.executable, str(ROOT / "launch.py"), "--experiment=rl_async", f"--workdir={work}",
           *sets]
    if not args.no_train:
        work.mkdir(parents=True, exist_ok=True)
        with open(work.parent / f"{work.name}.log", "w") as f:
            p = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
        if p.returncode != 0:
            raise SystemExit(f"the run failed (rc {p.returncode}); see "
                             f"{work.parent / work.name}.log")
    rows = [json.loads(x) for x in (work / "metrics.jsonl").read_text().splitlines() if x]
    train = sorted((r for r in rows if "reward_mean" in r and "easy_generated_tokens_mean" in r
                    and "hard_generated_tokens_mean" in r), key=lambda r: r["step"])
    w = args.window
    first, last = train[:w], train[-w:]
    lines = [f"rl_length: {' '.join(cmd[1:])}",
             ("scored after the run (--no-train); " if args.no_train else
              f"2 CPUs (shared), 1-min load average at start {load0:.1f}, at end "
              f"{os.getloadavg()[0]:.1f}; ") + f"{len(train)} versions; mean +- SE over the first / last "
             f"{w} versions (each: the batch's T=1 episodes of that level)", "",
             f"{'level':<6}{'metric':<24}{'first':>16}{'last':>16}{'change':>10}{'z':>7}"]
    for level in ("easy", "hard"):
        for metric in ("generated_tokens_mean", "resolved_rate"):
            key = f"{level}_{metric}"
            a, sa = _stats([r[key] for r in first])
            b, sb = _stats([r[key] for r in last])
            z = (b - a) / math.hypot(sa, sb) if math.hypot(sa, sb) > 0 else float("nan")
            lines.append(f"{level:<6}{metric:<24}{a:>9.2f}+-{sa:<5.2f}{b:>9.2f}+-{sb:<5.2f}"
                         f"{b - a:>+10.2f}{z:>7.1f}")
    lines += _eval_lines(work)
    text = "\n".join(lines)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "rl_length.txt", "a" if args.append else "w") as f:
        f.write(("\n" if args.append else "") + text + "\n")
    print(text)


if __name__ == "__main__":
    main()
