"""Correlation statistics of the pretraining-loss -> RL-score sweep (pure numpy).

`correlate(points, ...)`: Pearson and Spearman correlation of x (loss) and y (score) over budgets,
where each budget has one x and one y per seed; the point estimate uses the seed means, the
interval is a percentile bootstrap that resamples budgets (cases) and, within each, seeds; the
p-value is the exact permutation test of the budgets' seed means (two-sided; with K budgets the
smallest possible p is 2/K!).
"""
from __future__ import annotations

import itertools
import math

import numpy as np


def pearson(x, y) -> float:
    """Pearson r; NaN when either side is constant."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    dx, dy = x - x.mean(), y - y.mean()
    den = math.sqrt(float((dx * dx).sum() * (dy * dy).sum()))
    return float((dx * dy).sum() / den) if den > 0 else float("nan")


def ranks(x) -> np.ndarray:
    """Ranks from 1 with ties given their average rank."""
    x = np.asarray(x, float)
    order = np.argsort(x, kind="stable")
    r = np.empty(len(x))
    r[order] = np.arange(1, len(x) + 1)
    for v in np.unique(x):
        tie = x == v
        r[tie] = r[tie].mean()
    return r


def spearman(x, y) -> float:
    return pearson(ranks(x), ranks(y))


def permutation_p(x, y, stat) -> float:
    """Exact two-sided permutation p-value of |stat(x, y)| over all orderings of y (K <= 8)."""
    obs = abs(stat(x, y))
    if not math.isfinite(obs) or len(y) > 8:
        return float("nan")
    vals = [abs(stat(x, list(p))) for p in itertools.permutations(y)]
    return float(np.mean([v >= obs - 1e-12 for v in vals]))


def bootstrap(groups: list[tuple[float, list[float]]], stat, n: int, level: float,
              seed: int = 0) -> tuple[float, float, int]:
    """Percentile interval of stat(x, seed-mean y) over `n` resamples of budgets and, within each,
    of seeds; resamples where a side is constant (stat NaN) are dropped. Returns (lo, hi, kept)."""
    rng = np.random.default_rng(seed)
    k, vals = len(groups), []
    for _ in range(n):
        pick = rng.integers(0, k, size=k)
        xs = [groups[i][0] for i in pick]
        ys = [float(np.mean(rng.choice(groups[i][1], size=len(groups[i][1])))) for i in pick]
        v = stat(xs, ys)
        if math.isfinite(v):
            vals.append(v)
    if not vals:
        return float("nan"), float("nan"), 0
    a = (1 - level) / 2
    return float(np.quantile(vals, a)), float(np.quantile(vals, 1 - a)), len(vals)


def correlate(groups: list[tuple[float, list[float]]], n: int, level: float) -> dict:
    """{pearson, spearman}: each {r, ci: [lo, hi], p_permutation, bootstrap_kept} for budgets
    given as (loss, [score per seed])."""
    x = [g[0] for g in groups]
    y = [float(np.mean(g[1])) for g in groups]
    out = {}
    for name, stat in (("pearson", pearson), ("spearman", spearman)):
        lo, hi, kept = bootstrap(groups, stat, n, level)
        out[name] = {"r": stat(x, y), "ci": [lo, hi], "p_permutation": permutation_p(x, y, stat),
                     "bootstrap_kept": kept}
    return out


def verdict(corr: dict, level: float) -> str:
    """The plain reading of a Spearman result (the claim predicts r < 0: lower loss, more score)."""
    r, (lo, hi) = corr["spearman"]["r"], corr["spearman"]["ci"]
    pct = f"{level:.0%}"
    if not math.isfinite(r):
        return "undefined: loss or score does not vary over the budgets"
    if hi < 0:
        return (f"consistent with the claim: Spearman r = {r:.2f}, its {pct} bootstrap interval "
                f"[{lo:.2f}, {hi:.2f}] is below 0 (lower loss, higher RL score)")
    if lo > 0:
        return (f"against the claim: Spearman r = {r:.2f}, {pct} interval [{lo:.2f}, {hi:.2f}] is "
                f"above 0 (lower loss, LOWER RL score)")
    return (f"null result: Spearman r = {r:.2f}, but its {pct} bootstrap interval [{lo:.2f}, "
            f"{hi:.2f}] includes 0, so this sweep shows no reliable relation at this scale")
