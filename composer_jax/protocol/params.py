"""`SamplingParams`: per-request sampling and stopping (plain Python, no JAX), so that the agent
package and rollout workers can build requests without importing the engine."""
from __future__ import annotations

import dataclasses

from composer_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling and stopping. temperature 0 = greedy; top_k 0 = off; top_p 1 = off.

    Generation stops at the first of: a token in `stop_tokens` (kept in the output), a
    `stop_strings` match in the detokenised completion (needs an engine `detokenize` function),
    `max_new_tokens`, or the context length. `seed` fixes the request's PRNG stream.

    `forced_tokens` (teacher forcing): the request emits exactly these tokens instead of sampling
    (stopping early on the conditions above, else with finish reason "forced" after the last one);
    their log-probabilities are still those of the distribution set by temperature/top-k/top-p, so
    a scripted policy run through the engine gets real behaviour log-probabilities.
    """
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 64
    stop_tokens: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    seed: int | None = None
    forced_tokens: tuple[int, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "forced_tokens", tuple(int(t) for t in self.forced_tokens))
        object.__setattr__(self, "stop_tokens", tuple(int(t) for t in self.stop_tokens))
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
