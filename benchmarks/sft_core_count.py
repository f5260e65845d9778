"""Does the lookup SFT policy depend on the machine's core count? The same SFT (config, seed,
demonstrations) for `--steps` steps in fresh processes pinned to 1 core and to 2 cores (XLA:CPU
sizes its intra-op thread pool from the cores a process may use, so its reductions can be split
differently); reports a digest of the parameters of each, twice per core count.

    python benchmarks/sft_core_count.py [--steps 30]

Writes benchmarks/results/sft_core_count.txt."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def child(steps: int) -> None:
    sys.path.insert(0, str(ROOT))
    import numpy as np
    import jax
    from composer_jax.api import make_config
    from composer_jax.agent import lookup as lk
    from composer_jax.rl.tasks.lookup_sft import sft_policy
    cfg = make_config("rl_async")
    tasks = lk.make_tasks(cfg.rl.task.num_train_tasks, cfg.seed, "train", tuple(cfg.rl.task.levels))
    params, _ = sft_policy(cfg, tasks, steps)
    leaves = [np.asarray(x) for x in jax.tree.leaves(params)]
    h = hashlib.sha256(b"".join(x.tobytes() for x in leaves)).hexdigest()[:16]
    norm = float(sum(float(np.sum(x.astype(np.float64) ** 2)) for x in leaves) ** 0.5)
    print(json.dumps({"digest": h, "norm": norm, "cpus": len(os.sched_getaffinity(0))}))


def main(argv=None) -> str:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--child", action="store_true")
    args = ap.parse_args(argv)
    if args.child:
        child(args.steps)
        return ""
    lines = [f"lookup SFT, {args.steps} steps (rl_async config, sft_seed 0), fresh process each; "
             f"command: python benchmarks/sft_core_count.py --steps {args.steps}"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    for cores in ("0", "0,1", "0", "0,1"):
        out = subprocess.run(["taskset", "-c", cores, sys.executable, __file__, "--child",
                              "--steps", str(args.steps)], env=env, capture_output=True,
                             text=True, check=True).stdout.strip().splitlines()[-1]
        r = json.loads(out)
        lines.append(f"cores {cores:4s} ({r['cpus']} cpu): params digest {r['digest']}, "
                     f"norm {r['norm']:.9f}")
    text = "\n".join(lines) + "\n"
    (ROOT / "benchmarks" / "results" / "sft_core_count.txt").write_text(text)
    return text


if __name__ == "__main__":
    print(main())
