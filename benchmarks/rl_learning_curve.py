"""The RL learning curve on the known-optimum parity tasks (`composer_jax.rl.toy_tasks`): a fresh
tiny MoE policy, sampled on the inference engine (sessions, router capture), trained by `rl_step`
(Dr.GRPO, truncated IS, router replay), new weights swapped into the engine after every step.

    python benchmarks/rl_learning_curve.py [--steps 300] [--lr 3e-3] [--kinds even,odd]

Writes benchmarks/results/rl_learning_curve.txt (one row per step) and .png (reward_mean and its
20-step moving average, resolved_rate, entropy). Optimum reward 1.0; a uniform policy scores ~0.5.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from composer_jax.rl import toy_tasks as tt  # noqa: E402

OUT = pathlib.Path(__file__).resolve().parent / "results"
COLUMNS = ("step", "reward_mean", "resolved_rate", "entropy", "kl_k1", "is_weight_mean",
           "mismatch_abs", "grad_norm", "sample_s", "train_s")


def moving_average(x, n: int = 20) -> np.ndarray:
    x = np.asarray(x, np.float64)
    c = np.cumsum(np.insert(x, 0, 0.0))
    return np.array([(c[i + 1] - c[max(0, i + 1 - n)]) / (i + 1 - max(0, i + 1 - n))
                     for i in range(len(x))])


def write_curve(history: list[dict], args, wall_s: float, out: pathlib.Path = OUT) -> str:
    """Writes the .txt (and .png) curve; returns the summary line."""
    out.mkdir(parents=True, exist_ok=True)
    r = np.array([h["reward_mean"] for h in history])
    first, last = r[:20].mean(), r[-20:].mean()
    summary = (f"reward_mean first 20 steps {first:.3f} -> last 20 steps {last:.3f} "
               f"(+{last - first:.3f}); optimum 1.0; {len(r)} steps in {wall_s:.0f} s wall "
               f"(shared 2-core CPU)")
    lines = [f"# rl_learning_curve: parity tasks kinds={args.kinds} lr={args.lr} "
             f"tasks/step={args.tasks} group={args.group} seed={args.seed}",
             f"# {summary}", "\t".join(COLUMNS)]
    for h in history:
        lines.append("\t".join(f"{h.get(c, float('nan')):.4f}" if c != "step" else str(h[c])
                               for c in COLUMNS))
    tmp = out / "rl_learning_curve.txt.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(out / "rl_learning_curve.txt")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    steps = [h["step"] for h in history]
    ax.plot(steps, r, alpha=0.3, label="reward_mean (per step)")
    ax.plot(steps, moving_average(r), label="reward_mean (20-step mean)")
    ax.plot(steps, moving_average([h["resolved_rate"] for h in history]),
            label="resolved_rate (20-step mean)")
    ax.axhline(1.0, color="k", lw=0.5, ls="--", label="optimum")
    ax2 = ax.twinx()
    ax2.plot(steps, [h["entropy"] for h in history], color="grey", lw=0.8, label="entropy")
    ax2.set_ylabel("entropy (nats/token)")
    ax.set_xlabel("RL step")
    ax.set_ylabel("reward")
    ax.set_title("rl_step on the parity tasks (tiny MoE, 2-core CPU)")
    ax.legend(loc="center right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "rl_learning_curve.png.tmp.png", dpi=110)
    (out / "rl_learning_curve.png.tmp.png").replace(out / "rl_learning_curve.png")
    plt.close(fig)
    return summary


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--kinds", default="even,odd")
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cfg = tt.toy_config(lr=args.lr, seed=args.seed)
    t0 = time.time()
    history = tt.train_toy(cfg, steps=args.steps, tasks_per_step=args.tasks,
                           group_size=args.group, kinds=tuple(args.kinds.split(",")),
                           log=lambda h: print(h["step"], f"{h['reward_mean']:.3f}",
                                               f"{h['entropy']:.3f}", flush=True))
    print(write_curve(history, args, time.time() - t0))


if __name__ == "__main__":
    main()
