"""KV-cached batched generation with the MLA latent cache, sampling, MTP speculative decoding, and
the continuous-batching engine the RL workers sample from.

Public names: `Engine`, `EngineConfig`, `SamplingParams`, `Completion`, `StreamEvent`,
`PromptTooLongError`, `QueueFullError`, `SessionBusyError`, `EngineStoppedError`, `generate`; the pure pieces live in
`cache`, `mla`, `forward`, `sampling`, `speculative` and `steps`.

The names load on first use, so the JAX-free modules (`params`: SamplingParams, `requests`:
Completion and the errors) import without JAX (rollout workers, the agent package).
"""
import importlib
import sys
import types

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


class _Package(types.ModuleType):
    """`composer_jax.inference.generate` is both a submodule and the function it defines: importing
    the submodule sets the package attribute to the module, so this keeps the function there (as
    the eager import did), and `from composer_jax.inference import generate` is always callable."""

    def __setattr__(self, name, value):
        if name == "generate" and isinstance(value, types.ModuleType):
            value = value.generate
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
