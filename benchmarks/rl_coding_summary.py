"""Summarises an `rl_async --set rl.task=coding` run from its rollout log: which episodes each
trainer version consumed (`rollouts/consumed.jsonl`), each episode's reward breakdown and
behaviour (`rollouts/*/*.rollout`), and the evaluator's rows of `metrics.jsonl`.

Prints a per-version table and, for each behaviour/reward quantity, the mean over the episodes of
the first third of the versions vs the last third with its standard error over episodes (SE of a
mean = std / sqrt(n); for the pooled valid-call rate, a bootstrap over episodes), their difference
with its SE, and whether the move is in the direction the reward pays for.

    python benchmarks/rl_coding_summary.py WORKDIR [--out FILE.txt] [--json FILE.json]
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# quantity -> (how to read it from an episode, the direction the reward pays for: +1 up, -1 down)
QUANTITIES = {
    "reward_total": (lambda r: r.reward.get("total", 0.0), +1),
    "resolved": (lambda r: float(r.reward.get("resolved", 0.0) > 0), +1),
    "valid_calls": (lambda r: max(r.info.get("num_calls", 0) - r.info.get("num_invalid_calls", 0), 0), 0),
    "invalid_calls": (lambda r: r.info.get("num_invalid_calls", 0), -1),
    "tool_calls": (lambda r: r.info.get("num_calls", 0), 0),
    "turns": (lambda r: r.info.get("num_turns", 0), 0),
    "generated_tokens": (lambda r: r.info.get("generated_tokens", 0), 0),
    "reward_effort": (lambda r: r.reward.get("effort", 0.0), -1),
    "reward_length": (lambda r: r.reward.get("length", 0.0), -1),
    "reward_invalid_calls": (lambda r: r.reward.get("invalid_calls", 0.0), -1),
    "reward_valid_calls": (lambda r: r.reward.get("valid_calls", 0.0), +1),
    "reward_communication": (lambda r: r.reward.get("communication", 0.0), +1),
    "reward_false_claim": (lambda r: r.reward.get("false_claim", 0.0), -1),
}


def load_run(workdir: pathlib.Path):
    """`(episodes by version, eval rows)`: {version: [Rollout, ...]} from the consumed log, and
    the metrics.jsonl rows that carry `eval_resolved_rate`."""
    from composer_jax.rl.rollout import Rollout
    from composer_jax.rl.stream import RolloutLog, group_of
    log = RolloutLog(workdir / "rollouts")
    by_version = {int(row["version"]): [Rollout.load(log.record_path(group_of(rid), rid))
                                        for rid in row["rollout_ids"]]
                  for row in log.consumed_rows()}
    evals = []
    if (workdir / "metrics.jsonl").exists():
        for line in (workdir / "metrics.jsonl").read_text().splitlines():
            row = json.loads(line)
            if "eval_resolved_rate" in row:
                evals.append(row)
    return by_version, evals


def mean_se(x) -> tuple[float, float]:
    """Mean and its standard error (std with ddof=1 over sqrt(n); 0 for n < 2)."""
    x = np.asarray(x, np.float64)
    if len(x) == 0:
        return math.nan, math.nan
    return float(x.mean()), float(x.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else 0.0


def valid_rate_se(calls, valid, reps: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Pooled valid-call rate sum(valid) / sum(calls) and its bootstrap SE over episodes."""
    calls, valid = np.asarray(calls, np.float64), np.asarray(valid, np.float64)
    if calls.sum() == 0:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(calls), size=(reps, len(calls)))
    c, v = calls[idx].sum(1), valid[idx].sum(1)
    boot = v[c > 0] / c[c > 0]
    return float(valid.sum() / calls.sum()), float(boot.std(ddof=1))


def summarise(workdir: pathlib.Path) -> tuple[str, dict]:
    by_version, evals = load_run(workdir)
    versions = sorted(by_version)
    if len(versions) < 3:
        raise SystemExit(f"{workdir}: {len(versions)} trained versions; need at least 3 for thirds")
    lines = []
    cols = ["version", "episodes", "reward", "resolved", "valid_rate", "calls", "invalid", "turns",
            "gen_tok", "effort", "length_pen", "invalid_pen", "false_claim", "errors"]
    lines.append(" ".join(f"{c:>11}" for c in cols))
    for v in versions:
        eps = [r for r in by_version[v] if r.error is None]
        calls = sum(r.info.get("num_calls", 0) for r in eps)
        inv = sum(r.info.get("num_invalid_calls", 0) for r in eps)
        vals = [v, len(by_version[v])] + [np.mean([QUANTITIES[q][0](r) for r in eps]) if eps else math.nan
                                          for q in ("reward_total", "resolved")]
        vals.append((calls - inv) / calls if calls else math.nan)
        vals += [np.mean([QUANTITIES[q][0](r) for r in eps]) if eps else math.nan
                 for q in ("tool_calls", "invalid_calls", "turns", "generated_tokens", "reward_effort",
                           "reward_length", "reward_invalid_calls", "reward_false_claim")]
        vals.append(len(by_version[v]) - len(eps))
        lines.append(" ".join(f"{x:>11}" if isinstance(x, int) else f"{x:>11.3f}" for x in vals))
    n = len(versions)
    third = n // 3
    first, last = versions[:third], versions[-third:]
    stats = {"versions": n, "first_versions": [first[0], first[-1]],
             "last_versions": [last[0], last[-1]], "quantities": {}}
    lines.append("")
    lines.append(f"first third = versions {first[0]}-{first[-1]}, last third = versions "
                 f"{last[0]}-{last[-1]}; mean +- SE over episodes (error rollouts excluded)")
    lines.append(f"{'quantity':>22} {'first':>17} {'last':>17} {'last-first':>17} {'z':>6}  rewarded")
    eps_f = [r for v in first for r in by_version[v] if r.error is None]
    eps_l = [r for v in last for r in by_version[v] if r.error is None]

    def row(name, a, sa, b, sb, direction):
        d, sd = b - a, math.hypot(sa, sb)
        z = d / sd if sd > 0 else math.nan
        way = {+1: "up", -1: "down", 0: "-"}[direction]
        verdict = ("" if direction == 0 or not np.isfinite(z) else
                   "  rewarded way" if d * direction > 0 else "  AGAINST")
        lines.append(f"{name:>22} {a:>8.4f} +- {sa:.4f} {b:>8.4f} +- {sb:.4f} {d:>+8.4f} +- {sd:.4f}"
                     f" {z:>6.2f}  {way}{verdict}")
        stats["quantities"][name] = {"first": a, "first_se": sa, "last": b, "last_se": sb,
                                     "diff": d, "diff_se": sd, "z": z, "rewarded_direction": way}

    rf = valid_rate_se([r.info.get("num_calls", 0) for r in eps_f],
                       [QUANTITIES["valid_calls"][0](r) for r in eps_f])
    rl = valid_rate_se([r.info.get("num_calls", 0) for r in eps_l],
                       [QUANTITIES["valid_calls"][0](r) for r in eps_l])
    row("valid_call_rate", *rf, *rl, +1)
    for q, (get, direction) in QUANTITIES.items():
        row(q, *mean_se([get(r) for r in eps_f]), *mean_se([get(r) for r in eps_l]), direction)
    if evals:
        lines.append("")
        for e in evals:
            lines.append(f"eval at version {int(e['step'])}: eval_resolved_rate "
                         f"{e['eval_resolved_rate']:.3f} on {int(e.get('eval_tasks', 0))} eval-suite tasks")
        stats["eval"] = {int(e["step"]): e["eval_resolved_rate"] for e in evals}
    return "\n".join(lines), stats


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workdir", type=pathlib.Path)
    ap.add_argument("--out", type=pathlib.Path, help="also write the text here")
    ap.add_argument("--json", type=pathlib.Path, help="write the first/last-third stats here")
    a = ap.parse_args()
    text, stats = summarise(a.workdir)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")
    if a.json:
        a.json.write_text(json.dumps(stats, indent=1))


if __name__ == "__main__":
    main()
