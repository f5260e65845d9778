"""How an episode reaches the policy: a `PolicyClient` calls the policy server's methods (in
process, over a worker's pipe or through Ray); `EngineClient` gives the token-level agent the
engine interface it needs (`submit`, `wait`, `end_session`, `cfg.max_len`,
`model_cfg.vocab_size`) on top of one. Completions cross as `Completion.to_fields()` and come
back as `Completion.from_fields(...)`. No JAX.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from composer_jax.agent.episode_checkpoint import EngineUnavailable
from composer_jax.protocol.params import SamplingParams
from composer_jax.protocol.requests import Completion


class PolicyClient(Protocol):
    """Calls a method of the policy server (`rl.policy_server.EnginePolicyServer`): generate,
    submit, wait, end_session."""

    def call(self, method: str, *args, **kwargs) -> Any: ...


@dataclasses.dataclass(frozen=True)
class EngineLimits:
    """The engine facts an agent reads: `max_len` (context) ..."""
    max_len: int


@dataclasses.dataclass(frozen=True)
class ModelFacts:
    """... and `vocab_size` of the served model."""
    vocab_size: int


class AgentEngine(Protocol):
    """The engine interface the token agent runs on: the engine itself, `EngineClient` (the
    policy server's), or `agent.forced_engine.ForcedEngine` (scripted episodes)."""
    cfg: EngineLimits
    model_cfg: ModelFacts

    def submit(self, prompt, params: SamplingParams, session=None) -> int: ...

    def wait(self, request_id: int, timeout=None) -> Completion: ...

    def end_session(self, session: str) -> None: ...


class EngineClient:
    """What TokenAgent needs of an engine, served by the policy server through `policy`. A
    failed call raises `EngineUnavailable` (the episode can resume from its last checkpoint);
    ending a session is best effort (the engine may be gone)."""

    def __init__(self, policy: PolicyClient, max_len: int, vocab_size: int):
        self.policy = policy
        self.cfg = EngineLimits(max_len)
        self.model_cfg = ModelFacts(vocab_size)

    def _call(self, method: str, *args):
        try:
            return self.policy.call(method, *args)
        except Exception as e:  # noqa: BLE001  (whatever the transport raised)
            raise EngineUnavailable(f"the policy server's {method} failed: "
                                    f"{type(e).__name__}: {e}") from e

    def generate(self, prompt, params: SamplingParams) -> Completion:
        """One whole request (no session)."""
        return Completion.from_fields(self._call("generate", [int(t) for t in prompt], params))

    def submit(self, prompt, params: SamplingParams, session=None) -> int:
        return self._call("submit", [int(t) for t in prompt], params, session)

    def wait(self, request_id: int, timeout=None) -> Completion:
        return Completion.from_fields(self._call("wait", request_id, timeout))

    def end_session(self, session: str) -> None:
        try:
            self.policy.call("end_session", session)
        except Exception:  # noqa: BLE001  (a dead engine has no session to end)
            pass
