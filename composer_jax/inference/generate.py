"""One-call batched generation on top of the engine."""
from __future__ import annotations

from typing import Sequence

from flax import nnx

from composer_jax.inference.config import EngineConfig
from composer_jax.inference.engine import Engine
from composer_jax.protocol.requests import Completion
from composer_jax.inference.sampling import SamplingParams


def generate(model, prompts: Sequence[Sequence[int]],
             params: SamplingParams | Sequence[SamplingParams] = SamplingParams(),
             cfg: EngineConfig | None = None, version: int = 0) -> list[Completion]:
    """Completes every prompt (each with its own length and stop conditions); returns the
    completions in prompt order. `model` is a Transformer or a (graphdef, state) pair; by default
    all prompts run in one batch with a context of the longest prompt plus max_new_tokens."""
    graphdef, state = model if isinstance(model, tuple) else nnx.split(model)
    plist = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
    if len(plist) != len(prompts):
        raise ValueError(f"{len(plist)} SamplingParams for {len(prompts)} prompts")
    if cfg is None:
        need = max(len(p) + q.max_new_tokens for p, q in zip(prompts, plist))
        cfg = EngineConfig(max_batch=len(prompts), max_len=need + 1, max_queue=len(prompts))
    engine = Engine(graphdef, state, cfg, version=version)
    ids = [engine.submit(p, q) for p, q in zip(prompts, plist)]
    done = engine.run()
    return [done[i] for i in ids]
