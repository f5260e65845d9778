"""The comparison of a sweep's trials: WORKDIR/sweep.md (a table), sweep.json and sweep.png (one
panel per metric, a bar per trial). A metric's value is its last logged value in the trial's
metrics.jsonl."""
from __future__ import annotations

import json
import math

from composer_jax.runlog import read_metrics

PREFERRED = ("val_loss", "loss", "reward_mean", "eval_resolved_rate", "eval_reward_mean")


def last_values(trial_dir) -> dict[str, float]:
    """Each numeric metric's last value in the trial's metrics.jsonl."""
    out: dict[str, float] = {}
    for row in read_metrics(trial_dir):
        for k, v in row.items():
            if k not in ("step", "time") and isinstance(v, (int, float)) and not isinstance(v, bool):
                out[k] = float(v)
    return out


def choose_metrics(rows: list[dict], wanted: tuple[str, ...]) -> list[str]:
    """The table's metric columns: `wanted`, else the preferred ones the trials logged."""
    if wanted:
        return list(wanted)
    have = {k for r in rows for k in r["metrics"]}
    return [m for m in PREFERRED if m in have] or sorted(have)[:3]


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def write_table(rows: list[dict], keys: list[str], metrics: list[str], sweep_dir) -> str:
    """Writes sweep.md / sweep.json / sweep.png; returns the markdown table. A row:
    {"trial", "point": {key: text}, "status", "seconds", "metrics": {name: value}}."""
    head = ["trial", *keys, "status", *metrics]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["trial"], *(r["point"][k] for k in keys), r["status"],
                 *(_fmt(r["metrics"].get(m)) for m in metrics)]
        lines.append("| " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    summary = json.dumps({"keys": keys, "metrics": metrics, "trials": rows}, indent=1)
    if _read(sweep_dir / "sweep.json") != summary:     # a rerun that ran nothing writes nothing
        (sweep_dir / "sweep.md").write_text(table + "\n")
        _plot(rows, metrics, sweep_dir / "sweep.png")
        (sweep_dir / "sweep.json").write_text(summary)
    return table


def _read(path) -> str | None:
    return path.read_text() if path.exists() else None


def _plot(rows: list[dict], metrics: list[str], path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    if not metrics:
        return
    fig, axes = plt.subplots(1, len(metrics), figsize=(4 + 2.5 * len(metrics), 3.5), squeeze=False)
    names = [r["trial"] for r in rows]
    for ax, m in zip(axes[0], metrics):
        vals = [r["metrics"].get(m, float("nan")) for r in rows]
        ax.bar(range(len(rows)), vals)
        ax.set_xticks(range(len(rows)), names, rotation=45, ha="right", fontsize=7)
        ax.set_title(m)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
