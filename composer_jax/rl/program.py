"""What an RL run trains: the three sides of an `RLProgram`, built by name in every process.
The task families' program is `rl/task_program.py` (`rl.task`); tests build small ones of their own.

The services (`rl/services.py`) are generic; an `RLProgram` supplies what differs between the real
job (token-level agent on the engine, sandboxed coding or known-optimum tasks, `rl_step`) and the
small programs used to test the orchestration:

- env side (runs in rollout workers; must not import JAX):
  `train_tasks()`, `eval_tasks()` -> task ids, and
  `run_episode(task_id, seed, policy, *, greedy) -> Rollout` where `policy` is a `PolicyClient`
  (calls named methods of the policy server, in process, over a pipe or through Ray).
- inference side: `make_policy() -> PolicyServer` with `load_from(store, version)` (applied in
  flight, between decode steps), `version`, `rpc(method, args, kwargs)` (what `run_episode` calls)
  and `stats()` (for example `engine_busy_s`).
- trainer side: `make_learner() -> Learner` with `init_state()`, `step(state, groups) ->
  (state, metrics)` (groups: list of lists of `Rollout`, G per task), `weights(state)` (what the
  weight store publishes; a pytree of arrays) and `state_template()` for checkpoint restore.

A `ProgramSpec` names a factory `"module:function"` and its JSON-able kwargs, so a spawned process
or a Ray actor rebuilds the same program without pickling it. A program is cheap to construct:
heavy things (JAX, the model, the engine) are built only by the side that needs them.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Protocol

from composer_jax.agent.policy_client import PolicyClient
from composer_jax.errors import ConfigError


class PolicyServer(Protocol):
    version: int

    def load_from(self, store, version: int) -> None: ...
    def rpc(self, method: str, args: tuple, kwargs: dict) -> Any: ...
    def stats(self) -> dict: ...


class Learner(Protocol):
    def init_state(self): ...
    def state_template(self): ...
    def step(self, state, groups: list) -> tuple[Any, dict]: ...
    def weights(self, state): ...


class RLProgram(Protocol):
    def train_tasks(self) -> list[str]: ...
    def eval_tasks(self) -> list[str]: ...
    def run_episode(self, task_id: str, seed: int, policy: PolicyClient, *, greedy: bool): ...
    def make_policy(self) -> PolicyServer: ...
    def make_learner(self) -> Learner: ...


@dataclasses.dataclass(frozen=True)
class ProgramSpec:
    """A program by name: `factory` is "package.module:function", called with `kwargs`."""
    factory: str
    kwargs: dict = dataclasses.field(default_factory=dict)

    def build(self) -> RLProgram:
        return build_program(self)


_CACHE: dict[tuple, RLProgram] = {}


def build_program(spec: ProgramSpec) -> RLProgram:
    """Imports and calls the factory (once per process and spec)."""
    import json
    key = (spec.factory, json.dumps(spec.kwargs, sort_keys=True, default=str))
    if key in _CACHE:
        return _CACHE[key]
    module, _, fn = spec.factory.partition(":")
    if not module or not fn:
        raise ConfigError(f"program factory {spec.factory!r} must look like 'package.module:function'")
    try:
        factory = getattr(importlib.import_module(module), fn)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"program factory {spec.factory!r} cannot be imported: {e}") from None
    program = factory(**spec.kwargs)
    _CACHE[key] = program
    return program


class LocalClient:
    """A PolicyClient calling a PolicyServer in the same process."""

    def __init__(self, server: PolicyServer):
        self.server = server

    def call(self, method: str, *args, **kwargs):
        return self.server.rpc(method, args, kwargs)
