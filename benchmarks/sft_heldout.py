"""How robust is the lookup SFT policy (version 0 of `rl_async`)? For each SFT length and core
count, a fresh process pinned to those cores trains the SFT policy into an empty cache (so nothing
trained elsewhere is read back) and scores it on the 256 held-out tasks exactly as the run scores
version 0 (`rl.family_eval.FamilyEvaluator`).

    python benchmarks/sft_heldout.py [--sft_steps 300,500] [--cores 0 0,1] [--sft_seeds 0]
                                     [--set rl.task.sft_schedule=cosine ...] [--out NAME]

Writes benchmarks/results/NAME.txt (default sft_heldout)."""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def child(sft_steps: int, sft_seed: int, overrides: list[str]) -> None:
    sys.path.insert(0, str(ROOT))
    from composer_jax.api import make_config
    from composer_jax.rl.family_eval import FamilyEvaluator
    from composer_jax.rl.program import build_program
    from composer_jax.rl.task_program import task_program_spec
    cfg = make_config("rl_async", [f"rl.task.sft_steps={sft_steps}",
                                   f"rl.task.sft_seed={sft_seed}", *overrides])
    program = build_program(task_program_spec(cfg))
    t0 = time.monotonic()
    model = program.initial_model()
    sft_s = time.monotonic() - t0
    ev = FamilyEvaluator(program, cfg)
    try:
        row = ev(model, 0)
    finally:
        ev.close()
    print(json.dumps({"rate": row["eval_resolved_rate"], "se": row["eval_resolved_se"],
                      "sft_s": sft_s, "cpus": len(os.sched_getaffinity(0))}))


def main(argv=None) -> str:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sft_steps", default="300,500")
    ap.add_argument("--cores", nargs="+", default=["0", "0,1"])
    ap.add_argument("--sft_seeds", default="0")
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE config override")
    ap.add_argument("--out", default="sft_heldout")
    ap.add_argument("--child", nargs=2, type=int)
    args = ap.parse_args(argv)
    if args.child:
        child(*args.child, args.set)
        return ""
    lines = [f"lookup SFT policy (version 0 of rl_async) on the 256 held-out tasks, trained in a "
             f"fresh process into an empty cache; command: python benchmarks/sft_heldout.py "
             f"--sft_steps {args.sft_steps} --cores {' '.join(args.cores)} "
             f"--sft_seeds {args.sft_seeds}" + "".join(f" --set {x}" for x in args.set)]
    for steps in map(int, args.sft_steps.split(",")):
        for seed in map(int, args.sft_seeds.split(",")):
            for cores in args.cores:
                with tempfile.TemporaryDirectory(prefix="sft_cache_") as cache:
                    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT),
                           "COMPOSER_JAX_CACHE": cache}
                    p = subprocess.run(["taskset", "-c", cores, sys.executable, __file__,
                                        "--child", str(steps), str(seed),
                                        *[f"--set={x}" for x in args.set]], env=env,
                                       capture_output=True, text=True)
                if p.returncode != 0:
                    lines.append(f"sft_steps {steps} seed {seed} cores {cores}: FAILED "
                                 f"{p.stderr[-500:]}")
                    continue
                r = json.loads(p.stdout.strip().splitlines()[-1])
                lines.append(f"sft_steps {steps:4d} sft_seed {seed} cores {cores:4s} "
                             f"({r['cpus']} cpu): held-out {r['rate']:.3f} +- {r['se']:.3f} "
                             f"(SFT {r['sft_s']:.0f} s)")
                print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    (ROOT / "benchmarks" / "results" / f"{args.out}.txt").write_text(text)
    return text


if __name__ == "__main__":
    print(main())
