"""KV-cached batched generation with the MLA latent cache, sampling, MTP speculative decoding, and
the continuous-batching engine the RL workers sample from.

Public names: `Engine`, `EngineConfig`, `SamplingParams`, `Completion`, `StreamEvent`,
`PromptTooLongError`, `QueueFullError`, `SessionBusyError`, `EngineStoppedError`, `generate`; the
pure pieces live in `cache`, `mla`, `forward`, `sampling`, `speculative` and `steps`. The request
and completion types are `composer_jax.protocol`'s (JAX-free, shared with the agent package).

The names load on first use, so importing the package imports no JAX.
"""
import importlib
import sys
import types

_WHERE = {"EngineConfig": "composer_jax.inference.config",
          "Engine": "composer_jax.inference.engine",
          "generate": "composer_jax.inference.generate",
          **{name: "composer_jax.protocol" for name in (
              "SamplingParams", "Completion", "EngineStoppedError", "PromptTooLongError",
              "QueueFullError", "SessionBusyError", "StreamEvent")}}

__all__ = ["Engine", "EngineConfig", "SamplingParams", "Completion", "StreamEvent",
           "PromptTooLongError", "QueueFullError", "SessionBusyError", "EngineStoppedError", "generate"]


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'composer_jax.inference' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)


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
