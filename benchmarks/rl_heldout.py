"""The README main command over several seeds: held-out score at the first and the last evaluation.

    python benchmarks/rl_heldout.py [--seeds 0,1,2] [--runs runs/rl_heldout] [--set k=v ...]
                                    [--check-cli] [--offpolicy-only]

For each seed: `python launch.py --experiment=rl_async --workdir=RUNS/seed<S> --set seed=<S>`
(plus the --set overrides), then the run's metrics.jsonl gives the held-out evaluation (greedy
episodes of every held-out task, `rl/family_eval.py`) at the first version (0: the SFT policy
before RL) and the last, each with its standard error over the held-out tasks. Pooled over seeds:
the mean of the per-seed scores, SE = sqrt(sum SE_i^2) / n, and z = (last - first) /
sqrt(SE_first^2 + SE_last^2). With --check-cli, the first seed's run is also scored from the
command line (`launch.py --experiment=eval --set eval.policy=RUN@0` and `eval.policy=RUN`) and both
numbers are compared with the run's own. Each seed also reports how far its trained rollouts were
from the learner's policy (`offpolicy`; `--offpolicy-only` prints that line for existing runs and
runs nothing). Results: benchmarks/results/rl_heldout.txt (+ .json).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _rows(workdir: pathlib.Path) -> list[dict]:
    return [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines() if x]


def evals_of(workdir: pathlib.Path) -> list[dict]:
    """The held-out evaluation rows of a run, by version (the newest row of each version)."""
    by = {}
    for r in _rows(workdir):
        if "eval_resolved_se" in r and "eval_reward_mean" in r:
            by[int(r["step"])] = r
    return [by[k] for k in sorted(by)]


def offpolicy(workdir: pathlib.Path, upto: int = 15) -> dict:
    """How far the trained rollouts were from the learner's policy in versions 1..`upto` (the
    early phase, where the policy moves fastest) and over the whole run: the maxima of the
    per-version `mismatch_abs` (mean |behaviour - learner log-prob| per token) and
    `is_weight_max` (the largest behaviour importance ratio before truncation)."""
    train = [r for r in _rows(workdir) if "loss" in r and "mismatch_abs" in r]
    early = [r for r in train if int(r["step"]) <= upto]
    return {"upto": upto,
            "early_mismatch_max": max(r["mismatch_abs"] for r in early),
            "early_is_weight_max": max(r["is_weight_max"] for r in early),
            "mismatch_max": max(r["mismatch_abs"] for r in train),
            "is_weight_max": max(r["is_weight_max"] for r in train)}


def offpolicy_line(per_seed: list[tuple[int, dict]]) -> str:
    return ("off-policy gap of the trained rollouts (per seed; versions 1-%d, then whole run): " %
            per_seed[0][1]["upto"]) + "; ".join(
        f"seed {s}: mismatch_abs max {o['early_mismatch_max']:.3f}, IS weight max "
        f"{o['early_is_weight_max']:.1f} (whole run {o['mismatch_max']:.3f}, "
        f"{o['is_weight_max']:.1f})" for s, o in per_seed)


def _shown(path: str) -> str:
    """`path` relative to the repository when it lies inside it (results name no machine paths)."""
    try:
        return str(pathlib.Path(path).relative_to(ROOT))
    except ValueError:
        return path


def _launch(args: list[str], log: pathlib.Path) -> float:
    t0 = time.time()
    with open(log, "w") as f:
        p = subprocess.run([sys.executable, str(ROOT / "launch.py"), *args], cwd=ROOT, stdout=f,
                           stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed (rc {p.returncode}); see {log}")
    return time.time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--runs", default=str(ROOT / "runs" / "rl_heldout"))
    ap.add_argument("--set", action="append", default=[], dest="overrides")
    ap.add_argument("--check-cli", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--offpolicy-only", action="store_true",
                    help="run nothing: print the off-policy line of the existing RUNS/seed<S>")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = pathlib.Path(args.runs)
    if args.offpolicy_only:
        print(offpolicy_line([(s, offpolicy(runs / f"seed{s}")) for s in seeds]))
        return
    runs.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()
    per_seed = []
    for s in seeds:
        work = runs / f"seed{s}"
        sets = [x for o in [f"seed={s}", *args.overrides] for x in ("--set", o)]
        wall = _launch(["--experiment=rl_async", f"--workdir={work}", *sets], runs / f"seed{s}.log")
        ev = evals_of(work)
        first, last = ev[0], ev[-1]
        summary = json.loads((work / "rl_summary.json").read_text())
        train = [r for r in _rows(work) if "loss" in r and "reward_mean" in r]
        behaviour = {
            "versions": len(train),
            "false_claim_versions": sum(r.get("reward_false_claim_mean", 0) > 0 for r in train),
            "false_claim_mean": sum(r.get("reward_false_claim_mean", 0) for r in train) / len(train),
            "communication_versions": sum(r.get("reward_communication_mean", 0) > 0
                                          for r in train),
            "communication_mean": sum(r.get("reward_communication_mean", 0)
                                      for r in train) / len(train),
            "staleness_max": max(r["staleness_max"] for r in train),
            "stale_dropped_groups": sum(r.get("stale_dropped_groups", 0) for r in train)}
        per_seed.append({"seed": s, "wall_s": wall, "run_elapsed_s": summary.get("elapsed_s"),
                         "first_version": int(first["step"]), "last_version": int(last["step"]),
                         "first": first["eval_resolved_rate"], "first_se": first["eval_resolved_se"],
                         "last": last["eval_resolved_rate"], "last_se": last["eval_resolved_se"],
                         "first_reward": first["eval_reward_mean"],
                         "last_reward": last["eval_reward_mean"],
                         "curve": [(int(r["step"]), r["eval_resolved_rate"]) for r in ev],
                         "num_tasks": int(first["eval_num_tasks"]), "behaviour": behaviour,
                         "offpolicy": offpolicy(work),
                         "load_after": os.getloadavg()[0]})
        print(json.dumps({k: v for k, v in per_seed[-1].items() if k != "curve"}), flush=True)
    n = len(per_seed)
    first = sum(r["first"] for r in per_seed) / n
    last = sum(r["last"] for r in per_seed) / n
    se_first = math.sqrt(sum(r["first_se"] ** 2 for r in per_seed)) / n
    se_last = math.sqrt(sum(r["last_se"] ** 2 for r in per_seed)) / n
    z = (last - first) / max(math.sqrt(se_first ** 2 + se_last ** 2), 1e-12)
    cli = None
    if args.check_cli:
        work = runs / f"seed{seeds[0]}"
        out = {}
        for tag, pol in (("first", f"{work}@{per_seed[0]['first_version']}"), ("last", str(work))):
            d = runs / f"eval_{tag}"
            _launch(["--experiment=eval", f"--workdir={d}", "--set", f"eval.policy={pol}"],
                    runs / f"eval_{tag}.log")
            row = json.loads((d / "eval.json").read_text())
            out[tag] = {"policy": _shown(pol), "version": row["version"],
                        "resolved": row["eval_resolved_rate"], "se": row["eval_resolved_se"]}
        cli = out
    lines = [
        "rl_heldout: `python launch.py --experiment=rl_async` (lookup family, held-out keys) over "
        f"seeds {seeds}; overrides {args.overrides}",
        f"machine: {os.cpu_count()} CPUs (shared); 1/5/15-min load average at start "
        f"{load0[0]:.1f}/{load0[1]:.1f}/{load0[2]:.1f}, at end {os.getloadavg()[0]:.1f}",
        "", f"{'seed':>4} {'first (v)':>18} {'last (v)':>18} {'run s':>7}  (run s: the run's own "
            f"elapsed time, rl_summary.json; excludes the one-time cached SFT)"]
    for r in per_seed:
        lines.append(f"{r['seed']:>4} {r['first']:>8.3f}+-{r['first_se']:.3f} (v{r['first_version']})"
                     f" {r['last']:>8.3f}+-{r['last_se']:.3f} (v{r['last_version']})"
                     f" {r['run_elapsed_s'] or 0:>7.0f}")
    above = sum(r["last"] > r["first"] for r in per_seed)
    lines += ["", f"seeds ending above their version 0: {above}/{n}; longest run "
              f"{max(r['run_elapsed_s'] or 0 for r in per_seed):.0f} s of the run's own time, "
              f"{max(r['wall_s'] for r in per_seed):.0f} s wall (the first seed's wall includes "
              f"training the SFT policy into the cache)"]
    lines += ["", f"pooled over {n} seeds ({per_seed[0]['num_tasks']} held-out tasks each): "
              f"first {first:.3f} +- {se_first:.3f}, last {last:.3f} +- {se_last:.3f}, "
              f"z = {z:.2f}",
              "curves (version, held-out resolved): " + "; ".join(
                  f"seed {r['seed']}: " + ", ".join(f"{v}:{x:.2f}" for v, x in r["curve"])
                  for r in per_seed)]
    lines += ["", "behaviour terms and staleness in the training metrics (per seed): " + "; ".join(
        f"seed {r['seed']}: false-claim penalty fired in {r['behaviour']['false_claim_versions']}"
        f"/{r['behaviour']['versions']} versions (mean {r['behaviour']['false_claim_mean']:.4f}), "
        f"communication term in {r['behaviour']['communication_versions']}/"
        f"{r['behaviour']['versions']} (mean {r['behaviour']['communication_mean']:.4f}), "
        f"staleness_max {r['behaviour']['staleness_max']:.0f} (S=2), "
        f"{r['behaviour']['stale_dropped_groups']:.0f} stale groups dropped" for r in per_seed),
        offpolicy_line([(r["seed"], r["offpolicy"]) for r in per_seed])]
    if cli is not None:
        lines += ["", "command line (seed %d): " % seeds[0] + "; ".join(
            f"eval.policy={c['policy']} -> version {c['version']}, resolved {c['resolved']:.3f} "
            f"+- {c['se']:.3f}" for c in cli.values()),
            "z (command line, version %d -> %d) = %.2f" % (
                cli["first"]["version"], cli["last"]["version"],
                (cli["last"]["resolved"] - cli["first"]["resolved"])
                / max(math.hypot(cli["first"]["se"], cli["last"]["se"]), 1e-12)),
            "same as the run's own: " + str(
                abs(cli["first"]["resolved"] - per_seed[0]["first"]) < 1e-9
                and abs(cli["last"]["resolved"] - per_seed[0]["last"]) < 1e-9)]
    text = "\n".join(lines)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rl_heldout.txt").write_text(text + "\n")
    (out / "rl_heldout.json").write_text(json.dumps(
        {"seeds": per_seed, "first": first, "first_se": se_first, "last": last,
         "last_se": se_last, "z": z, "cli": cli}, indent=1))
    print(text)


if __name__ == "__main__":
    main()
