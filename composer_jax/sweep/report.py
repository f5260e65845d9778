"""The sweep's report: `sweep.json` (every cell, per-budget means, correlations, verdict),
`sweep.png` (held-out loss vs RL score, error bars over seeds) and `sweep.txt` (the same in words).
A sweep with unfinished cells is reported as PARTIAL, its correlations over finished cells only."""
from __future__ import annotations

import json
import math
import pathlib

import numpy as np

from composer_jax.sweep import stats

MEASURES = (("score_end", "held-out RL score at the end"),
            ("auc", "area under the held-out RL curve (mean score over versions)"),
            ("score_start", "held-out score before RL (version 0)"))


def _write(path: pathlib.Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_clean(x) for x in v]
    return v


def summarize(cells: list[dict], expected: int, n_boot: int, level: float) -> dict:
    """Per-budget means and the correlations of each measure over budgets (finished cells only)."""
    done = [c for c in cells if c["finished"]]
    budgets = []
    for b in sorted({c["budget"] for c in done}):
        cs = [c for c in done if c["budget"] == b]
        row = {"budget": b, "val_loss": cs[0]["val_loss"], "seeds": [c["seed"] for c in cs]}
        for m, _ in MEASURES:
            v = [c[m] for c in cs]
            row[m] = {"mean": float(np.mean(v)), "sd": float(np.std(v, ddof=1)) if len(v) > 1
                      else 0.0, "per_seed": v}
        budgets.append(row)
    corr = {}
    if len(budgets) >= 2:
        for m, _ in MEASURES:
            corr[m] = stats.correlate([(r["val_loss"], r[m]["per_seed"]) for r in budgets],
                                      n_boot, level)
    partial = len(done) < expected
    main = corr.get("score_end")
    verdict = stats.verdict(main, level) if main else "not enough finished budgets (need >= 2)"
    return {"partial": partial, "cells_finished": len(done), "cells_expected": expected,
            "budgets": budgets, "correlation": corr,
            "verdict": ("PARTIAL (not the result; %d of %d cells): " % (len(done), expected)
                        if partial else "") + verdict}


def text(summary: dict, command: str, level: float) -> str:
    lines = [f"command: {command}",
             f"cells finished: {summary['cells_finished']} of {summary['cells_expected']}"
             + ("  -- PARTIAL: these numbers are not the sweep's result" if summary["partial"]
                else ""), "",
             "budget  val_loss  score_end (mean +- sd over seeds)  auc  score_start"]
    for r in summary["budgets"]:
        lines.append(f"{r['budget']:6d}  {r['val_loss']:8.4f}  {r['score_end']['mean']:.3f} +- "
                     f"{r['score_end']['sd']:.3f}  {r['auc']['mean']:.3f}  "
                     f"{r['score_start']['mean']:.3f}   seeds {r['seeds']}")
    lines.append("")
    for m, what in MEASURES:
        c = summary["correlation"].get(m)
        if not c:
            continue
        lines.append(f"val_loss vs {m} ({what}):")
        for k in ("pearson", "spearman"):
            x = c[k]
            lines.append(f"  {k:8s} r = {x['r']:+.3f}  {level:.0%} bootstrap CI [{x['ci'][0]:+.3f}, "
                         f"{x['ci'][1]:+.3f}] ({x['bootstrap_kept']} resamples)  exact "
                         f"permutation p = {x['p_permutation']:.3f}")
    lines += ["", "verdict: " + summary["verdict"]]
    return "\n".join(lines) + "\n"


def plot(summary: dict, path: pathlib.Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5.5, 4))
    rs = summary["budgets"]
    if rs:
        x = [r["val_loss"] for r in rs]
        for m, label, fmt in (("score_end", "end of RL", "o"), ("score_start", "before RL", "s")):
            ax.errorbar(x, [r[m]["mean"] for r in rs], yerr=[r[m]["sd"] for r in rs], fmt=fmt,
                        capsize=3, label=label)
        for r in rs:
            ax.annotate(f"{r['budget']} steps", (r["val_loss"], r["score_end"]["mean"]),
                        textcoords="offset points", xytext=(4, 4), fontsize=7)
    c = summary["correlation"].get("score_end", {}).get("spearman")
    title = "PARTIAL sweep: " if summary["partial"] else ""
    if c and math.isfinite(c["r"]):
        title += f"Spearman {c['r']:+.2f} [{c['ci'][0]:+.2f}, {c['ci'][1]:+.2f}]"
    elif c:
        title += "correlation undefined: no variation over budgets"
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("held-out pretraining validation loss")
    ax.set_ylabel("held-out RL score (mean +- sd over seeds)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


def write_report(workdir: pathlib.Path, cells: list[dict], expected: int, config: dict,
                 command: str, n_boot: int, level: float) -> dict:
    """Writes sweep.json, sweep.png and sweep.txt in `workdir`; returns the summary."""
    s = summarize(cells, expected, n_boot, level)
    _write(workdir / "sweep.json", json.dumps(_clean({"command": command, **s, "cells": cells,
                                                      "config": config}), indent=2))
    _write(workdir / "sweep.txt", text(s, command, level))
    plot(s, workdir / "sweep.png")
    return s
