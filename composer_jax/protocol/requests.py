"""What goes into and comes out of the engine: requests, per-token records, completions, errors."""
from __future__ import annotations

import dataclasses

import numpy as np

from composer_jax.errors import ComposerError
from composer_jax.protocol.params import SamplingParams


class PromptTooLongError(ComposerError, ValueError):
    """A prompt (with its conversation history) does not fit the engine's context."""


class QueueFullError(ComposerError):
    """The engine's bounded request queue is full; retry after some requests finish."""


class SessionBusyError(ComposerError):
    """A conversation got a new turn while its previous turn is still generating."""


class EngineStoppedError(ComposerError, RuntimeError):
    """The engine's driver thread crashed or was stopped while a request was waiting."""


@dataclasses.dataclass
class Completion:
    """One request's output, token by token.

    tokens, logprobs (under the distribution sampled from), raw_logprobs (under the model at
    temperature 1), versions (policy version that sampled each token); router_indices [N,Lm,K]
    (experts of the forward pass that produced each token) and prompt_router_indices [P-1,Lm,K]
    (experts at the prompt positions before the last one) when the engine captures routing, so that
    prompt_router_indices ++ router_indices replays positions 0 .. P+N-2 of prompt ++ tokens.
    prompt_router_start: the sequence position of the first row of prompt_router_indices (the
    fed chunk of a session turn starts at the previous turn's last token, a rebuilt session at 0).
    finish_reason: "stop_token", "stop_string", "max_new_tokens", "length" (context full),
    "forced" (all forced tokens emitted) or "cancelled".
    submit_time / finish_time: time.monotonic() when the request was queued / finished.
    """
    request_id: int
    prompt: list[int]
    params: SamplingParams
    session: str | None = None
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    raw_logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    router_indices: list[np.ndarray] = dataclasses.field(default_factory=list)
    prompt_router_indices: np.ndarray | None = None
    prompt_router_start: int = 0
    finish_reason: str | None = None
    submit_time: float = 0.0
    finish_time: float = 0.0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def to_fields(self) -> dict:
        """The sampled record as plain fields (lists, numpy arrays, str): what crosses a pipe or
        Ray between a policy server and a rollout worker."""
        return {"tokens": list(self.tokens), "logprobs": list(self.logprobs),
                "raw_logprobs": list(self.raw_logprobs), "versions": list(self.versions),
                "router_indices": [np.asarray(r) for r in self.router_indices],
                "prompt_router_indices": (None if self.prompt_router_indices is None
                                          else np.asarray(self.prompt_router_indices)),
                "prompt_router_start": int(self.prompt_router_start),
                "finish_reason": self.finish_reason}

    @classmethod
    def from_fields(cls, fields: dict) -> "Completion":
        """The inverse of `to_fields` (request id -1, no prompt: the worker holds those)."""
        return cls(-1, [], SamplingParams(), **fields)


@dataclasses.dataclass(frozen=True)
class StreamEvent:
    """New tokens of one request since the last event (start = index of the first of them)."""
    request_id: int
    start: int
    tokens: tuple[int, ...]
    finished: bool
    finish_reason: str | None
