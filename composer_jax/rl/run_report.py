"""The short human summary printed at the end of an RL run (the numbers are in rl_summary.json):

    rl_async: 150/150 versions, 4800 rollouts in 41 s (117 rollouts/s)
      train reward 0.39 (versions 1-5) -> 0.99 (versions 146-150); held-out 0.54 (v0) -> 1.00 (v150)
      checkpoint runs/rl_async/checkpoints/150 | plots runs/rl_async/plots | summary .../rl_summary.json
      metrics runs/rl_async/metrics.jsonl | TensorBoard: tensorboard --logdir runs/rl_async/tb
      warning: held-out 0.310 at version 20 is below version 0's 0.367 (...)   (rl/health.py)
"""
from __future__ import annotations

import pathlib

from composer_jax.rl.health import health_warnings
from composer_jax.train.run_checkpoint import checkpoint_steps

WINDOW = 5       # versions averaged for the first / last training reward


def _fmt_s(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m} min {s} s" if m else f"{seconds:.0f} s"


def reward_first_last(rows: list[dict]) -> tuple | None:
    """((first versions, mean), (last versions, mean)) of the trainer rows' reward_mean."""
    train = [(int(r["step"]), r["reward_mean"]) for r in rows
             if isinstance(r.get("reward_mean"), float)]
    if not train:
        return None
    n = min(WINDOW, len(train))
    first, last = train[:n], train[-n:]

    def mean(xs):
        return sum(v for _, v in xs) / len(xs)
    return ((first[0][0], first[-1][0], mean(first)), (last[0][0], last[-1][0], mean(last)))


def end_summary(name: str, summary: dict, workdir, rows: list[dict]) -> str:
    """The lines described in the module docstring."""
    workdir = pathlib.Path(workdir)
    rate = summary["rollouts_per_sec"]
    rate = f"{rate:.0f}" if rate >= 10 else f"{rate:.2g}"     # 117, 9.5, 0.39
    head = (f"{name}: {summary['version']}/{summary.get('steps', summary['version'])} versions, "
            f"{summary['rollouts_finished']} rollouts in {_fmt_s(summary['elapsed_s'])} "
            f"({rate} rollouts/s)")
    if summary.get("stopped_by"):
        head += f"; stopped by {summary['stopped_by']} (rerun the same command to resume)"
    parts = []
    rw = reward_first_last(rows)
    if rw is not None:
        (a0, a1, ra), (b0, b1, rb) = rw
        parts.append(f"train reward {ra:.2f} (versions {a0}-{a1}) -> {rb:.2f} "
                     f"(versions {b0}-{b1})")
    ev = summary.get("eval", {})
    if ev:
        ks = sorted(ev, key=int)
        first, last = ev[ks[0]], ev[ks[-1]]
        key = ("heldout_parity_reward_mean" if "heldout_parity_reward_mean" in first
               else "eval_resolved_rate")
        if key in first and key in last:
            label = "held-out reward" if key.startswith("heldout") else "held-out resolved"
            parts.append(f"{label} {first[key]:.2f} (v{ks[0]}) -> {last[key]:.2f} (v{ks[-1]})")
    ckpts = checkpoint_steps(workdir)
    where = [f"checkpoint {workdir / 'checkpoints' / str(ckpts[-1])}" if ckpts else "no checkpoint",
             f"plots {workdir / 'plots'}", f"summary {workdir / 'rl_summary.json'}"]
    lines = [head]
    if parts:
        lines.append("  " + "; ".join(parts))
    lines.append("  " + " | ".join(where))
    lines.append(f"  metrics {workdir / 'metrics.jsonl'} | TensorBoard: tensorboard --logdir "
                 f"{workdir / 'tb'}")
    lines += ["  " + w for w in health_warnings(rows)]
    return "\n".join(lines)
