"""`ForcedEngine`: the engine interface the token agent runs on (`submit`, `wait`, `end_session`,
`cfg.max_len`, `model_cfg.vocab_size`, as `policy_client.EngineClient` serves it), with no model:
each request returns its forced tokens (`SamplingParams.forced_tokens`) as sampled, with
log-probability 0 and version 0, cut where the session's context reaches `max_len` as the real
engine cuts. Scripted episodes run through it (the SFT data of `rl.tasks.lookup_long`). No JAX."""
from __future__ import annotations

from composer_jax.agent.policy_client import EngineLimits, ModelFacts
from composer_jax.protocol import Completion, SamplingParams


class ForcedEngine:
    """An engine that emits each request's forced tokens (module docstring)."""

    def __init__(self, max_len: int, vocab_size: int):
        self.cfg = EngineLimits(max_len)
        self.model_cfg = ModelFacts(vocab_size)
        self._requests: list[Completion] = []
        self._used: dict = {}          # session -> context positions used

    def submit(self, prompt, params: SamplingParams, session=None) -> int:
        used = self._used.get(session, 0) + len(prompt)
        tokens = list(params.forced_tokens)[:max(self.cfg.max_len - used, 0)]
        self._used[session] = used + len(tokens)
        n = len(tokens)
        self._requests.append(Completion(
            len(self._requests), list(prompt), params, session, tokens=tokens,
            logprobs=[0.0] * n, raw_logprobs=[0.0] * n, versions=[0] * n,
            finish_reason="stop_token"))
        return len(self._requests) - 1

    def wait(self, request_id: int, timeout=None) -> Completion:
        return self._requests[request_id]

    def end_session(self, session: str) -> None:
        pass
