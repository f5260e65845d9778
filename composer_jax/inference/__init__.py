"""KV-cached batched generation with the MLA latent cache, sampling, MTP speculative decoding, and
the continuous-batching engine the RL workers sample from.

Public names: `Engine`, `EngineConfig`, `SamplingParams`, `Completion`, `StreamEvent`,
`PromptTooLongError`, `QueueFullError`, `SessionBusyError`, `EngineStoppedError`, `generate`; the pure pieces live in
`cache`, `mla`, `forward`, `sampling`, `speculative` and `steps`.
"""
from composer_jax.inference.config import EngineConfig
from composer_jax.inference.engine import Engine
from composer_jax.inference.generate import generate
from composer_jax.inference.requests import (Completion, EngineStoppedError, PromptTooLongError,
                                             QueueFullError, SessionBusyError, StreamEvent)
from composer_jax.inference.sampling import SamplingParams

__all__ = ["Engine", "EngineConfig", "SamplingParams", "Completion", "StreamEvent",
           "PromptTooLongError", "QueueFullError", "SessionBusyError", "EngineStoppedError", "generate"]
