"""Self-summarisation in a real run: the summarising policy vs the same policy truncated at the window.

    python benchmarks/rl_summarize.py [--workdir runs/rl_summarize] [--set k=v ...] [--no-train]

Trains `launch.py --experiment=rl_async` on the long-lookup family
(`rl.task=composer_jax.rl.tasks.lookup_long`: easy = one long note, hard = a chain of four; a
hard episode is longer than the 255-token context, `rl.seq_len=256`) with self-summarisation at
`rl.summary_trigger_tokens=176`: the policy writes each summary (a summary turn of the token
agent), and each segment is a training sample sharing the episode's reward. Then scores the first
and the last checkpoint on the held-out split twice, with the same sampling seeds per task:
summarising (the run's trigger) and truncated at the window (trigger 0: the episode ends
"context_full" when the context fills). Prints held-out resolved rate +- SE (per level too), the
paired difference (mean +- SE over tasks), how many of the policy's summaries name the optimal next
step, and examples of policy-written summaries. Results: benchmarks/results/rl_summarize.txt.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FAMILY = "composer_jax.rl.tasks.lookup_long"
DEFAULTS = [f"rl.task={FAMILY}", "model.vocab_size=640", "rl.seq_len=256",
            "rl.summary_trigger_tokens=176"]


def _mean_se(xs: list[float]) -> tuple[float, float]:
    n = len(xs)
    m = sum(xs) / n
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / max(n - 1, 1) / n)


def heldout_rollouts(workdir: pathlib.Path, version: int, trigger: int | None):
    """Held-out rollouts of checkpoint `version` with the run's config, the summary trigger
    replaced by `trigger` (None: the run's)."""
    from composer_jax.rl.family_eval import FamilyEvaluator, run_config
    from composer_jax.rl.program import build_program
    from composer_jax.rl.task_program import task_program_spec
    from composer_jax.train.weights import load_weights
    cfg = run_config(str(workdir))
    if trigger is not None:
        cfg = dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl,
                                                              summary_trigger_tokens=trigger))
    weights = load_weights(f"{workdir.resolve()}@{version}", cfg)
    ev = FamilyEvaluator(build_program(task_program_spec(cfg)), cfg)
    try:
        return ev.rollouts(weights.model(), version)
    finally:
        ev.close()


def _resolved(r) -> float:
    return float(r.error is None and r.reward.get("resolved", 0.0) == 1.0)


def _rows(name: str, rs: list) -> list[str]:
    out = []
    for level in (None, "easy", "hard"):
        sel = [r for r in rs if level is None or r.info.get("level") == level]
        m, se = _mean_se([_resolved(r) for r in sel])
        sums = [c for r in sel for c in r.info.get("summaries_correct", [])]
        stops = {}
        for r in sel:
            stops[r.info.get("stop_reason", "error")] = stops.get(
                r.info.get("stop_reason", "error"), 0) + 1
        out.append(f"  {name:<12}{level or 'all':<6}{m:>8.3f} +- {se:.3f}   n={len(sel):<4}"
                   f"summaries/ep {len(sums) / len(sel):.2f}  correct "
                   f"{(sum(sums) / len(sums)) if sums else float('nan'):.3f}  stops {stops}")
    return out


def _examples(rs: list, k: int = 4) -> list[str]:
    out = []
    for r in [r for r in rs if r.info.get("summaries")][:k]:
        notes = [s for s in r.info["summaries"]]
        out.append(f"  {r.task_id} resolved={_resolved(r):.0f} reads={r.info.get('reads')} "
                   f"summaries={json.dumps(notes)} correct={r.info['summaries_correct']}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", default=str(ROOT / "runs" / "rl_summarize"))
    ap.add_argument("--set", action="append", default=[], dest="overrides")
    ap.add_argument("--no-train", action="store_true", help="score an existing run only")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "rl_summarize.txt"))
    args = ap.parse_args()
    work = pathlib.Path(args.workdir)
    sets = [x for o in DEFAULTS + args.overrides for x in ("--set", o)]
    cmd = [sys.executable, str(ROOT / "launch.py"), "--experiment=rl_async", f"--workdir={work}",
           *sets]
    load0 = os.getloadavg()[0]
    if not args.no_train:
        work.mkdir(parents=True, exist_ok=True)
        with open(work.parent / f"{work.name}.log", "w") as f:
            p = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
        if p.returncode != 0:
            raise SystemExit(f"the run failed (rc {p.returncode}); see {work.parent / work.name}.log")
    from composer_jax.train.run_checkpoint import checkpoint_steps
    steps = checkpoint_steps(str(work))
    first, last = steps[0], steps[-1]
    lines = [f"rl_summarize: {' '.join(cmd[1:])}",
             f"2 CPUs (shared), 1-min load average at start {load0:.1f}; held-out split of the run "
             f"(sampled at T=1 with the seed of each task and version, the same seeds in both "
             f"modes); checkpoints {first} and {last}", ""]
    rows = [json.loads(x) for x in (work / "metrics.jsonl").read_text().splitlines() if x]
    train = [r for r in rows if "reward_mean" in r]
    if train:
        lines.append(f"training: {len(train)} versions, reward_mean first 5 "
                     f"{sum(r['reward_mean'] for r in train[:5]) / len(train[:5]):.3f} -> last 5 "
                     f"{sum(r['reward_mean'] for r in train[-5:]) / len(train[-5:]):.3f}")
    for v in (first, last):
        summ = heldout_rollouts(work, v, None)
        trunc = heldout_rollouts(work, v, 0)
        by_id = {r.task_id: r for r in trunc}
        diff = [_resolved(r) - _resolved(by_id[r.task_id]) for r in summ]
        d, dse = _mean_se(diff)
        lines += ["", f"version {v}: held-out resolved rate (mean +- SE over tasks)"]
        lines += _rows("summarising", summ) + _rows("truncated", trunc)
        lines.append(f"  paired difference summarising - truncated: {d:+.3f} +- {dse:.3f} "
                     f"(z = {d / dse if dse else float('nan'):.1f})")
        lines.append("  examples of policy-written summaries (held-out, summarising):")
        lines += _examples(summ)
    lines.append(f"\n1-min load average at end {os.getloadavg()[0]:.1f}")
    text = "\n".join(lines)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
