"""Timing generation runs (experiments and benchmarks): compile once, then measure."""
from __future__ import annotations

import time
from typing import Sequence

from composer_jax.inference.config import EngineConfig
from composer_jax.inference.engine import Engine
from composer_jax.inference.requests import Completion
from composer_jax.inference.sampling import SamplingParams


def timed_generation(graphdef, state, prompts: Sequence[Sequence[int]], params: SamplingParams,
                     cfg: EngineConfig, warmup: bool = True, repeats: int = 1):
    """Runs all prompts through a fresh engine (after an identical warm-up run that compiles every
    shape when `warmup`), `repeats` times. Returns (completions in prompt order, the fastest run's
    seconds, its engine)."""
    def once():
        eng = Engine(graphdef, state, cfg)
        t0 = time.perf_counter()
        ids = [eng.submit(p, params) for p in prompts]
        done = eng.run()
        return [done[i] for i in ids], time.perf_counter() - t0, eng

    if warmup:
        once()
    return min((once() for _ in range(repeats)), key=lambda r: r[1])


def tokens_per_second(completions: Sequence[Completion], seconds: float) -> float:
    return sum(len(c.tokens) for c in completions) / max(seconds, 1e-9)
