"""An environment-latency model for the known-optimum (parity) tasks: what the benchmark of
asynchronous vs synchronous RL uses to stand in for sandboxed tool calls and test runs.

A parity episode is one engine request and a rule grade: no environment time at all, which is
exactly what asynchronous RL does not help with. Real agentic episodes spend most of their wall
time in the environment (sandbox start-up, tool calls, test runs, grading), with a heavy tail. The
model draws each episode's environment time from *measured* sandboxed episodes:

    env_latency_samples.json   wall seconds of 160 evaluation episodes of the model-free scripted
                               policies (oracle: ~4 tool calls; heuristic: ~27, exploring), run in
                               the real bubblewrap sandbox with the real tools and grader
                               (benchmarks/results/eval_{oracle,heuristic}.json)

    latency = scale * (a sample drawn uniformly, seeded by the episode's seed)

and the episode sleeps that long, half before the reply is generated (exploring) and half after
(tests and grading), on the rollout worker (env side), never holding the engine. `scale` shrinks
the measured seconds so a CPU benchmark finishes; it keeps the distribution's shape (median 1.8 s,
p90 10 s, max 65 s unscaled), which is what decides how much overlap asynchronous RL can win.

This is a latency *model*: reports that use it must say so (benchmarks/rl_bench.py does).
JAX-free (runs in rollout workers).
"""
from __future__ import annotations

import functools
import json
import pathlib
import random

SAMPLES_FILE = pathlib.Path(__file__).with_name("env_latency_samples.json")


@functools.lru_cache(maxsize=1)
def measured_episode_seconds() -> tuple[float, ...]:
    """The measured environment seconds of every recorded sandboxed episode (all policies)."""
    data = json.loads(SAMPLES_FILE.read_text())
    out = [float(s) for p in data["policies"].values() for s in p["episode_s"]]
    if not out:
        raise ValueError(f"{SAMPLES_FILE} holds no episode times")
    return tuple(out)


def episode_latency(seed: int, scale: float) -> float:
    """Seconds of environment time of the episode with this seed: a measured episode's wall time
    (drawn uniformly, deterministic in `seed`) times `scale`. 0 when scale is 0."""
    if scale <= 0:
        return 0.0
    samples = measured_episode_seconds()
    return scale * samples[random.Random(seed * 7_919 + 17).randrange(len(samples))]


def summary(scale: float) -> dict:
    """Mean, median, p90 and max of the modelled episode latency at this scale (for reports)."""
    s = sorted(x * scale for x in measured_episode_seconds())
    n = len(s)
    return {"n": n, "scale": scale, "mean_s": sum(s) / n, "median_s": s[n // 2],
            "p90_s": s[int(0.9 * n)], "max_s": s[-1]}
