"""PNG plots of an RL run, from WORKDIR/metrics.jsonl and the driver's summary:

  plots/reward.png       reward_mean (training episodes) and eval_resolved_rate vs version
  plots/staleness.png    histogram of rollout staleness (trainer version - sampling version)
  plots/throughput.png   rollouts/s and trained tokens/s vs version, trainer idle fraction
  plots/behaviour.png    tool-using episodes only (rl.task=coding): valid-call rate, tool calls,
                         invalid calls, turns per episode, the effort x and the resolved rates
"""
from __future__ import annotations

import pathlib


def write_plots(workdir, summary: dict) -> list[pathlib.Path]:
    import matplotlib
    matplotlib.use("Agg")
    from composer_jax.runlog import read_metrics

    workdir = pathlib.Path(workdir)
    out = workdir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    rows = read_metrics(workdir)
    paths = [_reward(rows, summary, out / "reward.png"), _staleness(summary, out / "staleness.png"),
             _throughput(rows, out / "throughput.png")]
    behaviour = _behaviour(rows, out / "behaviour.png")
    return paths + ([behaviour] if behaviour is not None else [])


def _reward(rows, summary: dict, path: pathlib.Path) -> pathlib.Path:
    import matplotlib.pyplot as plt
    from composer_jax.runlog import metric_series
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (("reward_mean", "train reward_mean"), ("resolved_rate", "train resolved"),
                       ("eval_resolved_rate", "eval resolved (held-out; "
                        + ("eval suite" if summary.get("eval_source", "").startswith("eval suite")
                           else "held-out program tasks") + ")")):
        x, y = metric_series(rows, key)
        if x:
            ax.plot(x, y, marker="o" if key.startswith("eval") else None, label=label)
    ax.set_xlabel("policy version")
    ax.set_ylabel("reward / rate")
    ax.legend()
    ax.grid(alpha=0.3)
    return _save(fig, path)


def _staleness(summary: dict, path: pathlib.Path) -> pathlib.Path:
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    hist = {int(k): v for k, v in summary.get("staleness_hist", {}).items()}
    if hist:
        ks = sorted(hist)
        ax.bar(ks, [hist[k] for k in ks])
    ax.set_xlabel("staleness (trainer version - sampling version)")
    ax.set_ylabel("rollouts")
    return _save(fig, path)


def _throughput(rows, path: pathlib.Path) -> pathlib.Path:
    import matplotlib.pyplot as plt
    from composer_jax.runlog import metric_series
    fig, ax = plt.subplots(figsize=(6, 4))
    for key in ("rollouts_per_sec", "trained_tokens_per_sec"):
        x, y = metric_series(rows, key)
        if x:
            ax.plot(x, y, label=key)
    ax.set_xlabel("policy version")
    ax.set_ylabel("per second")
    ax.grid(alpha=0.3)
    ax2 = ax.twinx()
    x, y = metric_series(rows, "trainer_idle_frac")
    if x:
        ax2.plot(x, y, color="gray", linestyle="--", label="trainer_idle_frac")
        ax2.set_ylim(0, 1)
        ax2.set_ylabel("trainer idle fraction")
    ax.legend(loc="upper left")
    return _save(fig, path)


def _behaviour(rows, path: pathlib.Path) -> pathlib.Path | None:
    """Tool-using episodes only (None otherwise)."""
    import matplotlib.pyplot as plt
    from composer_jax.runlog import metric_series
    if not metric_series(rows, "tool_calls_mean")[0]:
        return None
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for key in ("valid_call_rate", "resolved_rate", "eval_resolved_rate"):
        x, y = metric_series(rows, key)
        if x:
            a.plot(x, y, marker="o" if key.startswith("eval") else ".", label=key)
    a.set_ylim(-0.05, 1.05)
    a.set_ylabel("rate")
    for key in ("tool_calls_mean", "invalid_calls_mean", "turns_mean", "reward_effort_mean"):
        x, y = metric_series(rows, key)
        if x:
            b.plot(x, y, marker=".", label=key)
    b.set_ylabel("per episode")
    for ax in (a, b):
        ax.set_xlabel("policy version")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(fig, path)


def _save(fig, path: pathlib.Path) -> pathlib.Path:
    import matplotlib.pyplot as plt
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
