"""What the agent and the inference engine exchange, in plain Python (no JAX): a request's
`SamplingParams` (`params`), and the engine's `Completion`, `StreamEvent` and request errors
(`requests`). The agent package and rollout workers build requests and read completions through
these types without importing the engine; the engine (`composer_jax.inference`) takes and returns
them."""
from composer_jax.protocol.params import SamplingParams
from composer_jax.protocol.requests import (Completion, EngineStoppedError, PromptTooLongError,
                                            QueueFullError, SessionBusyError, StreamEvent)

__all__ = ["Completion", "EngineStoppedError", "PromptTooLongError", "QueueFullError",
           "SamplingParams", "SessionBusyError", "StreamEvent"]
