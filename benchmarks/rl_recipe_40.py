"""One measured change at a time on the main command's recipe (issue 40): held-out curves and
health of finished `rl_async` runs, read from their own files.

    python benchmarks/rl_recipe_40.py NAME=RUN_DIR [NAME=RUN_DIR ...] [--out FILE]

Per run: the overrides it was launched with (config.json's `overrides`, if recorded, else the
differences of its config from the first run's), the held-out resolved rate at every evaluation
(+- SE), the lowest training valid-call rate, the most invalid calls per episode in a training
version, the largest behaviour importance weight, and the mean generated tokens of held-out
episodes at the first and last evaluation. Nothing is rerun.
"""
from __future__ import annotations

import argparse
import json
import pathlib


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def summary(run: pathlib.Path) -> dict:
    """The curves and health figures of one run directory."""
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
    ev = {int(r["step"]): r for r in rows if "eval_resolved_rate" in r}
    tr = [r for r in rows if "loss" in r and "valid_call_rate" in r]
    return {"evals": [(v, ev[v]["eval_resolved_rate"], ev[v]["eval_resolved_se"],
                       ev[v]["eval_generated_tokens_mean"]) for v in sorted(ev)],
            "valid_call_min": min(r["valid_call_rate"] for r in tr),
            "invalid_calls_max": max(r.get("invalid_calls_mean", 0.0) for r in tr),
            "is_weight_max": max(r["is_weight_max"] for r in tr),
            "config": _flat(json.loads((run / "config.json").read_text()))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="NAME=RUN_DIR")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    named = [x.split("=", 1) for x in args.runs]
    sums = [(n, summary(pathlib.Path(d))) for n, d in named]
    base = sums[0][1]["config"]
    lines = []
    for name, s in sums:
        diff = {k: v for k, v in s["config"].items()
                if k in base and base[k] != v and not k.startswith(("workdir", "overrides"))}
        lines.append(f"{name}: differs from {sums[0][0]} in {diff or 'nothing'}")
        lines.append("  held-out resolved by version: " + ", ".join(
            f"{v}: {x:.3f}+-{se:.3f}" for v, x, se, _ in s["evals"]))
        first, last = s["evals"][0], s["evals"][-1]
        dip = min(x for _, x, _, _ in s["evals"])
        lines.append(f"  lowest evaluation {dip:.3f} (version 0: {first[1]:.3f}); training "
                     f"valid-call rate min {s['valid_call_min']:.3f}, invalid calls per episode "
                     f"max {s['invalid_calls_max']:.2f}, IS weight max {s['is_weight_max']:.2f}; "
                     f"held-out generated tokens {first[3]:.1f} -> {last[3]:.1f}")
    text = "\n".join(lines)
    print(text)
    if args.out:
        pathlib.Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
