"""The policy server: the inference engine as a service, with weight versions applied in flight.

Methods a rollout worker calls (through a `PolicyClient`): `generate(ids, params)` (one whole
request) -> completion fields, `submit(ids, params, session)` -> request id (one turn of a
multi-turn session), `wait(request_id, timeout)` -> completion fields, `end_session(session)`.
Completions cross as `Completion.to_fields()`. The inference service (`rl.services`) calls
`load_from(store, version)`, `version`, `stats()` and `close()`.
"""
from __future__ import annotations

import threading
import time

from composer_jax.inference.config import EngineConfig
from composer_jax.inference.engine import Engine
from composer_jax.protocol.params import SamplingParams
from composer_jax.rl.weights.engine_sync import fetch_state

METHODS = ("generate", "submit", "wait", "end_session")


class EnginePolicyServer:
    """An `Engine` started as a background service for `model` with `engine_settings` (fields
    of EngineConfig: max_batch, max_len, prefill_batch), router capture per rl.router_replay, and
    MTP speculative sampling per inference.speculative / inference.spec_depth (same tokens,
    behaviour log-probs, router rows and versions as plain sampling under the same seed)."""

    def __init__(self, cfg, model, engine_settings: dict):
        spec = {"speculative": cfg.inference.speculative, "spec_depth": cfg.inference.spec_depth}
        ecfg = EngineConfig(capture_router=cfg.rl.router_replay, seed=cfg.seed,
                            **{**spec, **engine_settings})
        self.engine = Engine.from_model(model, ecfg, version=-1).start()
        self.version = -1
        self._lock = threading.Lock()
        self._inflight = 0
        self._busy_since = None
        self.busy_s = 0.0
        self.t0 = time.monotonic()

    def load_from(self, store, version: int) -> None:
        state, version = fetch_state(store.reader, version, self.engine.state)
        self.engine.swap_weights(state, version)    # applied between decode steps
        self.version = version

    def rpc(self, method: str, args: tuple, kwargs: dict):
        """Dispatches a client's call to one of METHODS."""
        if method not in METHODS:
            raise ValueError(f"the policy server has no method {method!r}; methods: {METHODS}")
        return getattr(self, method)(*args, **kwargs)

    def generate(self, ids, params) -> dict:
        params = params if isinstance(params, SamplingParams) else SamplingParams(**params)
        self._enter()
        try:
            c = self.engine.request(ids, params).result()
        finally:
            self._exit()
        return c.to_fields()

    def submit(self, ids, params, session=None) -> int:
        self._enter()
        try:
            fut = self.engine.request(ids, params, session=session)
        except BaseException:
            self._exit()
            raise
        fut.add_done_callback(lambda _: self._exit())
        return fut.request_id

    def wait(self, request_id: int, timeout=None) -> dict:
        return self.engine.wait(request_id, timeout=timeout).to_fields()

    def end_session(self, session: str) -> None:
        self.engine.end_session(session)

    def _enter(self):
        with self._lock:
            if self._inflight == 0:
                self._busy_since = time.monotonic()
            self._inflight += 1

    def _exit(self):
        with self._lock:
            self._inflight -= 1
            if self._inflight == 0:
                self.busy_s += time.monotonic() - self._busy_since

    def stats(self) -> dict:
        wall = time.monotonic() - self.t0
        out = {"engine_busy_s": self.busy_s, "engine_idle_frac": 1 - self.busy_s / max(wall, 1e-9)}
        if self.engine.cfg.draft_depth:     # speculation: acceptance and tokens per verify step
            m = self.engine.speculation_metrics()
            out["spec_acceptance"] = m["acceptance_per_depth"][0]
            out["spec_mean_accepted_length"] = m["mean_accepted_length"]
        return out

    def close(self) -> None:
        self.engine.stop(timeout=30)
