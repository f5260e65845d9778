"""rl_async on the coding tasks with MTP speculative sampling on vs off, side by side in one run.

Both runs use the `rl_async --set rl.task=coding` settings (sandboxed episodes with real tools, the
token-level agent against the engine policy server, rl_step, the weight store) with the same
overrides and seed; only `inference.speculative` differs. The policy (`--init_from`, the run's
model) must have an MTP module that has learned something: by default the `cpt_debug` run that
`benchmarks/results/spec_decode_bench.txt` measures (its MTP head trained with the model on code;
made by `python launch.py --experiment=cpt_debug --workdir=/tmp/engine_runs/cpt_debug_3k --set
train.steps=3000`, about 10 minutes here). The coding run's own SFT policy (`sft` experiment, built
on first use) also has a trained MTP head, when it is cached: pass its workdir. Runs go
in the order plain, spec, spec, plain, ... (`--repeats` pairs), so load drift on a shared machine
biases neither side.

Reported per run, over a timed window from the trainer's first published version (after the
rl_step and engine compiles) to the end of the run:
  rollouts/s          episodes finished in the window / window seconds
  gen tok/s           tokens the engine sampled for those episodes / window seconds
  acceptance, mean_accepted_len   the policy server's draft acceptance and tokens per verify step
  tokens/episode, turns/episode   what an episode cost (speculation must not change it much:
                                  the same seed samples the same tokens, but the weights of a
                                  version reach the engine at different times, so episodes differ)
and the ratio spec / plain of rollouts/s.

    PYTHONPATH=$PWD python benchmarks/rl_speculative.py [--init_from RUN] [--steps 4]
        [--repeats 1] [--set key=value ...]   # writes benchmarks/results/rl_speculative.txt
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

from machine_load import uptime  # noqa: E402  (benchmarks/machine_load.py)

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

OUT = ROOT / "benchmarks" / "results" / "rl_speculative.txt"
DEFAULT_INIT = "/tmp/engine_runs/cpt_debug_3k"


def coding_config(overrides: list[str]):
    """The rl_async coding config with `overrides` (the family's prepare resolves the pool)."""
    from composer_jax import registry
    from composer_jax.config import SECTION_PRESETS
    from composer_jax.overrides import apply_overrides
    from experiments.rl import prepare
    exp = registry.get("rl_async")
    cfg = apply_overrides(exp.make_config(), ["rl.task=coding", "rl.job.eval_every=0"] + overrides,
                          SECTION_PRESETS, rebase=exp.rebase)
    return prepare(cfg)


def run_one(name: str, overrides: list[str], workdir: pathlib.Path) -> dict:
    from composer_jax.rl.driver import run_rl
    from composer_jax.rl.rollout import Rollout
    from composer_jax.rl.settings import settings_from_config
    from composer_jax.rl.tasks import family_of
    from composer_jax.rl.task_program import task_program_spec
    from experiments.rl import make_store
    cfg = coding_config(overrides)
    workdir.mkdir(parents=True, exist_ok=True)
    family_of(cfg).write_run_files(workdir)
    t0 = time.time()
    summary = run_rl(task_program_spec(cfg), workdir, settings_from_config(cfg, progress=False),
                     make_store(cfg))
    wall = time.time() - t0
    rows = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "reward_mean" in r]
    start, end = rows[0]["time"], rows[-1]["time"]        # version 1 published .. the last
    eps = [Rollout.load(p) for p in sorted((workdir / "rollouts").glob("*/*.rollout"))]
    done = [r for r in eps if not r.error and
            start < r.timing["start_time"] + r.timing["episode_s"] <= end]
    gen = sum(int(r.info.get("generated_tokens", 0)) for r in done)
    inf = summary["inference"]
    return {"name": name, "speculative": cfg.inference.draft_depth > 0, "wall_s": wall,
            "window_s": end - start, "episodes": len(done),
            "error_rollouts": sum(bool(r.error) for r in eps),
            "rollouts_per_sec": len(done) / (end - start), "gen_tokens_per_sec": gen / (end - start),
            "tokens_per_episode": gen / max(len(done), 1),
            "turns_per_episode": sum(r.info.get("num_turns", 0) for r in done) / max(len(done), 1),
            "acceptance": inf.get("spec_acceptance", float("nan")),
            "mean_accepted_len": inf.get("spec_mean_accepted_length", float("nan")),
            "engine_idle_frac": inf.get("engine_idle_frac", float("nan")),
            "reward_mean": sum(r["reward_mean"] for r in rows) / len(rows),
            "versions": len(rows), "model": cfg.model.name, "mtp_depth": cfg.model.mtp_depth,
            "workers": cfg.rl.job.num_rollout_workers, "max_new_tokens": cfg.rl.max_new_tokens,
            "max_turns": cfg.env.max_turns, "temperature": cfg.rl.temperature}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--init_from", default=DEFAULT_INIT,
                    help="the policy: a run workdir whose MTP head was trained")
    ap.add_argument("--steps", type=int, default=4, help="versions per run (the first is warm-up)")
    ap.add_argument("--repeats", type=int, default=1, help="pairs, in the order plain/spec, "
                    "spec/plain, ...")
    ap.add_argument("--set", action="append", default=[], dest="overrides")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    if not (pathlib.Path(args.init_from) / "config.json").exists():
        raise SystemExit(f"--init_from={args.init_from} is not a run workdir (no config.json): "
                         f"give a run whose model has a trained MTP head (module docstring)")
    from absl import logging
    logging.set_verbosity(logging.WARNING)
    base = [f"rl.task.init_from={args.init_from}", f"rl.steps={args.steps}"] + args.overrides
    order = [("plain", "false"), ("spec", "true")]
    order = [o for r in range(args.repeats) for o in (order if r % 2 == 0 else order[::-1])]
    cmd = "PYTHONPATH=$PWD python benchmarks/rl_speculative.py " + " ".join(sys.argv[1:])
    load0 = uptime()
    runs = []
    with tempfile.TemporaryDirectory(prefix="rl_spec_") as tmp:
        for i, (name, flag) in enumerate(order):
            r = run_one(name, base + [f"inference.speculative={flag}"], pathlib.Path(tmp) / f"{i}")
            print(json.dumps(r), flush=True)
            runs.append(r)
    mean = {n: {k: sum(r[k] for r in runs if r["name"] == n) / args.repeats
                for k in ("rollouts_per_sec", "gen_tokens_per_sec", "tokens_per_episode")}
            for n in ("plain", "spec")}
    ratio = mean["spec"]["rollouts_per_sec"] / mean["plain"]["rollouts_per_sec"]
    tok_ratio = mean["spec"]["gen_tokens_per_sec"] / mean["plain"]["gen_tokens_per_sec"]
    r0 = runs[0]
    lines = [f"# benchmarks/rl_speculative.py — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"cpu x{os.cpu_count()} cores",
             f"# command: {cmd}",
             f"# rl_async --set rl.task=coding, policy {args.init_from} ({r0['model']}, mtp_depth "
             f"{r0['mtp_depth']}), {args.steps} versions per run (timed from version 1 on), "
             f"{r0['workers']} rollout workers (engine slots), {r0['max_turns']} turns x "
             f"{r0['max_new_tokens']} new tokens, T={r0['temperature']}; overrides {args.overrides}",
             f"# load at start: {load0}",
             f"{'run':<6}{'rollouts/s':>11}{'gen_tok/s':>10}{'episodes':>9}{'window_s':>9}"
             f"{'tok/episode':>12}{'turns/ep':>9}{'acceptance':>11}{'mean_acc_len':>13}"
             f"{'engine_idle':>12}{'errors':>7}"]
    for r in runs:
        lines.append(f"{r['name']:<6}{r['rollouts_per_sec']:>11.4f}{r['gen_tokens_per_sec']:>10.1f}"
                     f"{r['episodes']:>9d}{r['window_s']:>9.1f}{r['tokens_per_episode']:>12.1f}"
                     f"{r['turns_per_episode']:>9.2f}{r['acceptance']:>11.3f}"
                     f"{r['mean_accepted_len']:>13.3f}{r['engine_idle_frac']:>12.3f}"
                     f"{r['error_rollouts']:>7d}")
    lines += [f"spec / plain: rollouts/s {ratio:.2f}x, generated tokens/s {tok_ratio:.2f}x "
              f"(means over {args.repeats} run(s) each)",
              f"# load at end: {uptime()}"]
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    (out.with_suffix(".json")).write_text(json.dumps({"runs": runs, "ratio": ratio}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
