"""Compares RL runs' metrics.jsonl, versions 1-N, ignoring time fields (timestamps, step times,
throughput, idle fractions): per run the mean reward_mean, the first version reaching 0.99 and the
held-out eval at 0/50/100/150; per pair the bit-identical rows, identical reward_mean values, the
largest reward_mean difference and the largest loss difference over versions 1-10.

    python benchmarks/rl_compare_runs.py base=RUN_A/metrics.jsonl new=RUN_B/metrics.jsonl [...]
"""
from __future__ import annotations

import argparse
import gzip
import itertools
import json

TIME = ("time", "step_time_s", "trainer_idle_frac", "trained_tokens_per_sec", "rollouts_per_sec",
        "eval_time_s")


def rows(path: str) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for line in (gzip.open if path.endswith(".gz") else open)(path, "rt"):
        r = json.loads(line)
        out.setdefault(r["step"], {}).update(
            {k: v for k, v in r.items() if not k.startswith(TIME) and k != "step"})
    return out


def describe(name: str, r: dict, n: int) -> str:
    rm = [r[v]["reward_mean"] for v in range(1, n + 1)]
    first = next((v for v in range(1, n + 1) if r[v]["reward_mean"] >= 0.99), None)
    ev = [r.get(v, {}).get("eval_resolved_rate") for v in (0, 50, 100, 150)]
    return (f"{name:10s} mean reward_mean v1-{n} {sum(rm) / n:.4f}, v1-10 {sum(rm[:10]) / 10:.4f}, "
            f"last 10 {sum(rm[-10:]) / 10:.4f}; first version >= 0.99: {first}; "
            f"eval_resolved_rate at 0/50/100/150: {ev}")


def compare(na: str, a: dict, nb: str, b: dict, n: int) -> str:
    vs = range(1, n + 1)
    same_row = sum(a[v] == b[v] for v in vs)
    same_rm = sum(a[v]["reward_mean"] == b[v]["reward_mean"] for v in vs)
    d = max(abs(a[v]["reward_mean"] - b[v]["reward_mean"]) for v in vs)
    dl = max(abs(a[v]["loss"] - b[v]["loss"]) for v in range(1, min(n, 10) + 1))
    return (f"{na} vs {nb}: identical rows {same_row}/{n}, identical reward_mean {same_rm}/{n}, "
            f"max |d reward_mean| {d:.4g}, max |d loss| v1-10 {dl:.3g}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="NAME=path/to/metrics.jsonl")
    ap.add_argument("--versions", type=int, default=150)
    args = ap.parse_args()
    runs = {name: rows(path) for name, path in (a.split("=", 1) for a in args.runs)}
    for name, r in runs.items():
        print(describe(name, r, args.versions))
    for (na, a), (nb, b) in itertools.combinations(runs.items(), 2):
        print(compare(na, a, nb, b, args.versions))


if __name__ == "__main__":
    main()
