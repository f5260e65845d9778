"""PNG plots of an RL run, from WORKDIR/metrics.jsonl and the driver's summary:

  plots/reward.png       reward_mean (training episodes) per version; eval_resolved_rate as points
                         at the evaluated versions; the y-axis fits the data (a negative reward
                         is visible) with a line at 0
  plots/health.png       one panel, one scale each: policy entropy, KL to the initial policy
                         (kl_k1, logged when rl.kl_coef > 0), valid-call rate, importance weights
                         (mean; max) and held-out resolved rate with its standard error and
                         version 0's rate as a dashed line
  plots/staleness.png    histogram of rollout staleness (trainer version - sampling version)
  plots/throughput.png   rollouts/s, trained tokens/s and the trainer idle fraction per version,
                         one panel each (their scales differ by orders of magnitude)
  plots/behaviour.png    tool-using episodes only: rates; calls and turns per episode; the effort
                         x (its own panel: tens of tokens, not counts of ~2)

Every plot is titled with the run's name, each measured point is marked (held-out evaluations are
points at the versions evaluated, never joined as if measured in between).
"""
from __future__ import annotations

import pathlib

from composer_jax.runlog import metric_series, read_metrics


def write_plots(workdir, summary: dict) -> list[pathlib.Path]:
    import matplotlib
    matplotlib.use("Agg")

    workdir = pathlib.Path(workdir)
    out = workdir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    rows = read_metrics(workdir)
    run = workdir.name
    paths = [_reward(rows, summary, run, out / "reward.png"),
             _staleness(summary, run, out / "staleness.png"),
             _throughput(rows, run, out / "throughput.png"),
             _health(rows, run, out / "health.png")]
    behaviour = _behaviour(rows, run, out / "behaviour.png")
    return paths + ([behaviour] if behaviour is not None else [])


def _eval_points(ax, rows, label: str) -> None:
    x, y = metric_series(rows, "eval_resolved_rate")
    if x:
        ax.scatter(x, y, marker="D", s=36, color="black", zorder=3, label=label)


def _legend(ax) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def _reward(rows, summary: dict, run: str, path: pathlib.Path) -> pathlib.Path:
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, label in (("reward_mean", "train reward (mean per version)"),
                       ("resolved_rate", "train resolved rate")):
        x, y = metric_series(rows, key)
        if x:
            ax.plot(x, y, marker=".", markersize=3, linewidth=1, label=label)
    src = ("eval suite" if summary.get("eval_source", "").startswith("eval suite")
           else "held-out program tasks")
    _eval_points(ax, rows, f"held-out resolved ({src}), evaluated versions")
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_xlabel("policy version")
    ax.set_ylabel("reward / rate")
    ax.margins(y=0.05)              # the data's range: a negative reward stays visible
    ax.set_title(f"{run}: reward per version")
    _legend(ax)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def _staleness(summary: dict, run: str, path: pathlib.Path) -> pathlib.Path:
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    hist = {int(k): v for k, v in summary.get("staleness_hist", {}).items()}
    if hist:
        ks = sorted(hist)
        ax.bar(ks, [hist[k] for k in ks])
    ax.set_xlabel("staleness (trainer version - sampling version)")
    ax.set_ylabel("trained rollouts")
    ax.set_title(f"{run}: staleness of trained rollouts")
    return _save(fig, path)


def _throughput(rows, run: str, path: pathlib.Path) -> pathlib.Path:
    import matplotlib.pyplot as plt
    panels = [("rollouts_per_sec", "rollouts / s (since start)"),
              ("trained_tokens_per_sec", "trained tokens / s (step)"),
              ("trainer_idle_frac", "trainer idle fraction")]
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 7), sharex=True)
    for ax, (key, label) in zip(axes, panels):
        x, y = metric_series(rows, key)
        if x:
            ax.plot(x, y, marker=".", markersize=3, linewidth=1)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[-1].set_ylim(0, 1)
    axes[-1].set_xlabel("policy version")
    axes[0].set_title(f"{run}: throughput per version")
    return _save(fig, path)


def _health(rows, run: str, path: pathlib.Path) -> pathlib.Path:
    """The panels of the module docstring; a metric the run did not log says so in its panel."""
    import matplotlib.pyplot as plt
    panels = [("entropy", "policy entropy (nats / token)", ""),
              ("kl_k1", "KL to initial policy (k1)", "not logged (rl.kl_coef = 0)"),
              ("valid_call_rate", "valid-call rate", "no tool calls logged"),
              ("is_weight_mean", "IS weight, mean", ""),
              ("is_weight_max", "IS weight, max", "")]
    fig, axes = plt.subplots(len(panels) + 1, 1, figsize=(7, 13), sharex=True)
    for ax, (key, label, missing) in zip(axes, panels):
        x, y = metric_series(rows, key)
        if x:
            ax.plot(x, y, marker=".", markersize=3, linewidth=1)
            ax.margins(y=0.08)
        else:
            ax.text(0.5, 0.5, f"{key}: {missing or 'not logged'}", ha="center", va="center",
                    transform=ax.transAxes, fontsize=9, color="grey")
        ax.set_ylabel(label, fontsize=8)
        ax.grid(alpha=0.3)
    ax = axes[-1]
    x, y = metric_series(rows, "eval_resolved_rate")
    if x:
        se = dict(zip(*metric_series(rows, "eval_resolved_se")))
        ax.errorbar(x, y, yerr=[se.get(v, 0.0) for v in x], fmt="D", color="black", markersize=5,
                    capsize=3, label="held-out resolved (+- 1 s.e.)")
        base = dict(zip(x, y)).get(0)
        if base is not None:
            ax.axhline(base, color="tab:red", linestyle="--", linewidth=1,
                       label=f"version 0: {base:.3f}")
        ax.margins(y=0.1)
        _legend(ax)
    else:
        ax.text(0.5, 0.5, "no held-out evaluation logged", ha="center", va="center",
                transform=ax.transAxes, fontsize=9, color="grey")
    ax.set_ylabel("held-out resolved", fontsize=8)
    ax.grid(alpha=0.3)
    ax.set_xlabel("policy version")
    axes[0].set_title(f"{run}: health per version")
    return _save(fig, path)


def _behaviour(rows, run: str, path: pathlib.Path) -> pathlib.Path | None:
    """Tool-using episodes only (None otherwise): rates, counts per episode and the effort x,
    each on its own panel and scale."""
    import matplotlib.pyplot as plt
    if not metric_series(rows, "tool_calls_mean")[0]:
        return None
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4))
    for key in ("valid_call_rate", "resolved_rate"):
        x, y = metric_series(rows, key)
        if x:
            a.plot(x, y, marker=".", label=key)
    _eval_points(a, rows, "eval_resolved_rate")
    a.margins(y=0.05)
    a.set_ylabel("rate")
    a.set_title(f"{run}: rates")
    for key in ("tool_calls_mean", "invalid_calls_mean", "turns_mean"):
        x, y = metric_series(rows, key)
        if x:
            b.plot(x, y, marker=".", label=key)
    b.set_ylabel("per episode")
    b.set_title(f"{run}: calls and turns per episode")
    x, y = metric_series(rows, "reward_effort_mean")
    if x:
        c.plot(x, y, marker=".", label="reward_effort_mean")
    c.set_ylabel("effort x (tokens) per episode")
    c.set_title(f"{run}: effort per episode")
    for ax in (a, b, c):
        ax.set_xlabel("policy version")
        ax.grid(alpha=0.3)
        _legend(ax)
    return _save(fig, path)


def _save(fig, path: pathlib.Path) -> pathlib.Path:
    import matplotlib.pyplot as plt
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
