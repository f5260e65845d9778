"""What one sweep cell measured, read back from its run directories (no JAX).

A cell is one RL run (`W/cells/b{budget}-s{seed}`) started from the pretraining checkpoint of
`budget` steps; it is finished when its `rl_summary.json` reports the last version. Its held-out
curve is the `heldout_<family>_reward_mean` rows of its metrics.jsonl (greedy episodes of the
family's held-out tasks every rl.job.eval_every versions, version 0 included).
"""
from __future__ import annotations

import json
import pathlib

import numpy as np

from composer_jax.rl.stream import read_jsonl


def val_loss_at(cpt_dir: pathlib.Path, step: int) -> float:
    """The pretraining run's held-out validation loss logged at `step` (its last value there)."""
    got = [r["val_loss"] for r in read_jsonl(cpt_dir / "metrics.jsonl")
           if r.get("step") == step and "val_loss" in r]
    if not got:
        raise FileNotFoundError(f"{cpt_dir}/metrics.jsonl has no val_loss at step {step}; the "
                                f"pretraining run must evaluate at every budget")
    return float(got[-1])


def is_finished(cell_dir: pathlib.Path, steps: int) -> bool:
    p = cell_dir / "rl_summary.json"
    return p.exists() and json.loads(p.read_text()).get("version") == steps


def curve(cell_dir: pathlib.Path, metric: str) -> list[tuple[int, float]]:
    """[(version, held-out score)] sorted by version (the last row of a version wins)."""
    pts = {int(r["step"]): float(r[metric]) for r in read_jsonl(cell_dir / "metrics.jsonl")
           if metric in r}
    return sorted(pts.items())


def auc(points: list[tuple[int, float]], steps: int) -> float:
    """Area under the held-out curve over versions 0..steps, divided by steps (the curve's mean
    height: 1.0 is a perfect score from the start)."""
    if len(points) < 2:
        return float("nan")
    v, s = np.array([p[0] for p in points], float), np.array([p[1] for p in points], float)
    return float(np.sum((v[1:] - v[:-1]) * (s[1:] + s[:-1]) / 2) / max(steps, 1))


def cell_result(cell_dir: pathlib.Path, budget: int, seed: int, loss: float, steps: int,
                metric: str) -> dict:
    pts = curve(cell_dir, metric)
    return {"cell": cell_dir.name, "budget": budget, "seed": seed, "val_loss": loss,
            "finished": is_finished(cell_dir, steps),
            "score_start": pts[0][1] if pts and pts[0][0] == 0 else float("nan"),
            "score_end": pts[-1][1] if pts and pts[-1][0] == steps else float("nan"),
            "auc": auc(pts, steps) if pts and pts[-1][0] == steps else float("nan"),
            "curve": [list(p) for p in pts]}
