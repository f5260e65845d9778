"""Compares the rollout files of two RL runs by path: task, reward, tokens, trainable mask and
policy versions (and, beyond those, behaviour log-probs and routed experts).

    python benchmarks/rl_compare_rollouts.py RUN_A/rollouts RUN_B/rollouts
"""
from __future__ import annotations

import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from composer_jax.agent.rollout import Rollout  # noqa: E402


def same_sample(x: Rollout, y: Rollout) -> bool:
    return x.task_id == y.task_id and x.reward == y.reward and all(
        np.array_equal(getattr(a, f), getattr(b, f)) for a, b in zip(x.segments, y.segments)
        for f in ("tokens", "trainable", "versions")) and len(x.segments) == len(y.segments)


def same_numbers(x: Rollout, y: Rollout) -> bool:
    return all(np.array_equal(a.logprobs, b.logprobs) and
               np.array_equal(a.router_indices, b.router_indices)
               for a, b in zip(x.segments, y.segments))


def main(a: pathlib.Path, b: pathlib.Path) -> None:
    fa = {p.relative_to(a) for p in a.rglob("*.rollout")}
    fb = {p.relative_to(b) for p in b.rglob("*.rollout")}
    common = sorted(fa & fb)
    sample = numbers = 0
    for rel in common:
        x, y = Rollout.load(a / rel), Rollout.load(b / rel)
        if same_sample(x, y):
            sample += 1
            numbers += same_numbers(x, y)
    print(f"files {len(fa)} vs {len(fb)}, {len(common)} in both: same task/reward/tokens/versions "
          f"{sample}, of those also the same log-probs and routes {numbers}")


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]))
