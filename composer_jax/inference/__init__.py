"""KV-cached batched generation with the MLA latent cache, sampling, MTP speculative decoding, and
the continuous-batching engine the RL workers sample from.

Public names: `Engine`, `EngineConfig`, `SamplingParams`, `Completion`, `StreamEvent`,
`PromptTooLongError`, `QueueFullError`, `SessionBusyError`, `EngineStoppedError`, `generate`; the pure pieces live in
`cache`, `mla`, `forward`, `sampling`, `speculative` and `steps`.

The names load on first use, so the JAX-free modules (`params`: SamplingParams, `requests`:
Completion and the errors) import without JAX (rollout workers, the agent package).
"""
import importlib

_WHERE = {"EngineConfig": "config", "Engine": "engine", "generate": "generate",
          "SamplingParams": "params", "Completion": "requests", "EngineStoppedError": "requests",
          "PromptTooLongError": "requests", "QueueFullError": "requests",
          "SessionBusyError": "requests", "StreamEvent": "requests"}

__all__ = ["Engine", "EngineConfig", "SamplingParams", "Completion", "StreamEvent",
           "PromptTooLongError", "QueueFullError", "SessionBusyError", "EngineStoppedError", "generate"]


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'composer_jax.inference' has no attribute {name!r}")
    return getattr(importlib.import_module(f"composer_jax.inference.{_WHERE[name]}"), name)


def __dir__():
    return sorted(__all__)
