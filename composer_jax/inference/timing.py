"""Timing generation runs (experiments and benchmarks): compile once, then measure."""
from __future__ import annotations

import time
from typing import Sequence

from composer_jax.inference.config import EngineConfig
from composer_jax.inference.engine import Engine
from composer_jax.protocol.requests import Completion
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


def timed_sessions(engine: Engine, n_sessions: int, *, prompt_len: int, feed_len: int, turns: int,
                   new_tokens: int, vocab: int, seed: int = 0, tag: str = "") -> dict:
    """Runs `n_sessions` concurrent multi-turn conversations on a started `engine`, one thread
    each (the way episodes share an inference service): turn 1 feeds a `prompt_len` prompt, every
    later turn `feed_len` new tokens (a tool result) into the session's cache; each turn samples
    exactly `new_tokens` tokens (temperature 1, seeded). Returns {"tokens", "seconds",
    "tokens_per_sec", "decode_steps", "prefill_tokens"} over the whole run."""
    import concurrent.futures
    import dataclasses

    import numpy as np

    rng = np.random.default_rng(seed)
    feeds = [[rng.integers(0, vocab, prompt_len if t == 0 else feed_len).tolist()
              for t in range(turns)] for _ in range(n_sessions)]
    base = SamplingParams(temperature=1.0, max_new_tokens=new_tokens)

    def conversation(i):
        n = 0
        for t, feed in enumerate(feeds[i]):
            sp = dataclasses.replace(base, seed=seed * 100_003 + i * 1009 + t)
            n += len(engine.request(feed, sp, session=f"{tag}{i}").result().tokens)
        engine.end_session(f"{tag}{i}")
        return n

    before = dict(engine.stats)
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(n_sessions) as pool:
        tokens = sum(pool.map(conversation, range(n_sessions)))
    secs = time.perf_counter() - t0
    return {"tokens": tokens, "seconds": secs, "tokens_per_sec": tokens / max(secs, 1e-9),
            "decode_steps": engine.stats["decode_steps"] - before.get("decode_steps", 0),
            "prefill_tokens": engine.stats["prefill_tokens"] - before.get("prefill_tokens", 0)}
