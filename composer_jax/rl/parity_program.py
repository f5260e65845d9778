"""The RL program of `rl.tasks=parity`: the known-optimum task family (`rl/toy_tasks.py`) run
through the real pieces: the engine service (sessions, futures, in-flight `swap_weights`, router
capture), exact `Rollout` records, the weight store (`rl/weights`, delta-compressed versions) and
the pure `rl_step` (`rl/step.py`, Dr.GRPO with truncated IS).

Sides (see `rl/program.py`):
- env side (JAX-free): task -> prompt ids (the toy tokenizer), one `generate` call to the policy
  server, the rule grade (`toy_tasks.grade`) -> `Rollout` (`toy_tasks.rollout_from_completion`).
  With `rl.env_latency_scale > 0` each episode also spends a modelled environment time drawn from
  measured sandboxed episodes (`rl/latency_model.py`), half before and half after its reply.
- inference side: a `tiny` MoE policy in an `Engine` started as a background service; `load`
  applies a weight-store version in flight.
- trainer side: `build_rl_step` on the same initial weights; `make_batch` of the B·G rollouts.

Built from the run's resolved config (`config.to_dict`), so every process rebuilds the same program.
"""
from __future__ import annotations

import functools
import threading
import time
import types

import numpy as np

from composer_jax.data import special_tokens as st
from composer_jax.rl import toy_tasks as tt
from composer_jax.rl.latency_model import episode_latency


@functools.lru_cache(maxsize=2)
def _tokenizer(vocab_size: int):
    return tt.toy_tokenizer(vocab_size)


def _config(cfg_dict: dict):
    from composer_jax.config import Config, from_dict
    return from_dict(Config, cfg_dict)


class ParityProgram:
    def __init__(self, config: dict):
        self.cfg_dict = config
        self.cfg = _config(config)
        rl = self.cfg.rl
        kinds = tuple(rl.parity_kinds)
        self._train = tt.make_tasks(rl.num_train_tasks, self.cfg.seed, "train", kinds)
        self._eval = tt.make_tasks(rl.num_eval_tasks, self.cfg.seed, "eval", kinds)
        self._tasks = {t.task_id: t for t in self._train + self._eval}

    # ---------------------------------------------------------------- env side (no JAX)

    def train_tasks(self) -> list[str]:
        return [t.task_id for t in self._train]

    def eval_tasks(self) -> list[str]:
        return [t.task_id for t in self._eval]

    def run_episode(self, task_id: str, seed: int, policy, *, greedy: bool):
        rl = self.cfg.rl
        task = self._tasks[task_id]
        tok = _tokenizer(self.cfg.model.vocab_size)
        ids = tt.prompt_ids(tok, task)
        params = {"temperature": 0.0 if greedy else rl.temperature,
                  "max_new_tokens": rl.max_new_tokens,
                  "stop_tokens": (tok.token_to_id(st.IM_END),), "seed": seed}
        wait = episode_latency(seed, rl.env_latency_scale)     # 0 unless the latency model is on
        time.sleep(wait / 2)                # modelled exploring tool calls (env side, engine free)
        c = policy.call("generate", ids, params)
        time.sleep(wait / 2)                # modelled test runs and grading
        r = tt.rollout_from_completion(task, "", ids, types.SimpleNamespace(**c), tok)
        if wait:
            r.timing["modelled_env_s"] = wait
        return r

    # ---------------------------------------------------------------- inference side

    def make_policy(self):
        return ParityPolicy(self.cfg)

    # ---------------------------------------------------------------- trainer side

    def make_learner(self):
        return ParityLearner(self.cfg)


class ParityPolicy:
    """The engine as a policy server; `rpc("generate", ids, params)` -> completion fields."""

    def __init__(self, cfg, model=None):
        from composer_jax.inference.engine import Engine
        from composer_jax.model import init_model
        model = (init_model(cfg.model, cfg.seed, cfg.execution, cfg.train.init_std)
                 if model is None else model)
        self.engine = Engine.from_model(model, self.engine_config(cfg), version=-1).start()
        self.version = -1
        self._lock = threading.Lock()
        self._inflight = 0
        self._busy_since = None
        self.busy_s = 0.0
        self.t0 = time.monotonic()

    @staticmethod
    def engine_config(cfg):
        """The engine's settings: one decode slot per rollout worker, rows of rl.seq_len, and
        prefill in calls of up to that many rows (single-turn parity prompts arrive together)."""
        from composer_jax.inference.config import EngineConfig
        rows = max(cfg.rl.num_rollout_workers, 1)
        return EngineConfig(max_batch=rows, max_len=cfg.rl.seq_len,
                            capture_router=cfg.rl.router_replay, prefill_batch=rows, seed=cfg.seed)

    def load_from(self, store, version: int) -> None:
        from composer_jax.rl.weights.engine_sync import fetch_state
        state, version = fetch_state(store.reader, version, self.engine.state)
        self.engine.swap_weights(state, version)    # applied between decode steps
        self.version = version

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

    def rpc(self, method: str, args: tuple, kwargs: dict):
        if method != "generate":
            raise ValueError(f"ParityPolicy has no method {method!r}")
        from composer_jax.inference.sampling import SamplingParams
        ids, params = args
        self._enter()
        try:
            c = self.engine.request(ids, SamplingParams(**params)).result()
        finally:
            self._exit()
        return {"tokens": list(c.tokens), "logprobs": list(c.logprobs),
                "raw_logprobs": list(c.raw_logprobs), "versions": list(c.versions),
                "router_indices": [np.asarray(r) for r in c.router_indices],
                "prompt_router_indices": (None if c.prompt_router_indices is None
                                          else np.asarray(c.prompt_router_indices)),
                "finish_reason": c.finish_reason}

    def stats(self) -> dict:
        wall = time.monotonic() - self.t0
        return {"engine_busy_s": self.busy_s, "engine_idle_frac": 1 - self.busy_s / max(wall, 1e-9)}

    def close(self) -> None:
        self.engine.stop(timeout=30)


class ParityLearner:
    """`rl_step` on batches of B·G rollouts (parity here; the coding program reuses it with its
    own initial model: `make_model`, default a fresh `cfg.model` from `cfg.seed`)."""

    def __init__(self, cfg, make_model=None):
        self.cfg = cfg
        self._make_model = make_model
        self._fns = self._state = None
        self.error_penalty = cfg.rl.error_penalty   # error rollouts with tokens: reward -this

    def _build(self):
        if self._fns is None:
            from composer_jax.model import init_model
            from composer_jax.rl.step import build_rl_step
            c = self.cfg
            model = (init_model(c.model, c.seed, c.execution, c.train.init_std)
                     if self._make_model is None else self._make_model())
            self._fns, self._state = build_rl_step(model, self.cfg)
        return self._fns

    def init_state(self):
        self._build()
        return self._state

    def state_template(self):
        return self.init_state()

    def step(self, state, groups):
        import jax
        from composer_jax.rl.batch import make_batch
        fns = self._build()
        rollouts = [r for g in groups for r in g]
        batch = make_batch(rollouts, seq_len=self.cfg.rl.seq_len,
                           batch_size=self.cfg.rl.batch_groups * self.cfg.rl.group_size,
                           router_replay=self.cfg.rl.router_replay,
                           error_reward=-self.error_penalty)
        state, metrics = fns.rl_step(state, batch)
        return state, {k: float(v) for k, v in jax.device_get(metrics).items()}

    def weights(self, state):
        from composer_jax.rl.weights.engine_sync import publishable
        return publishable(state.params, state.buffers)

    def eval_model(self, state):
        """A model holding a copy of `state`'s weights (the state is donated by the next step),
        for the evaluator."""
        import jax
        import jax.numpy as jnp
        fns = self._build()
        return fns.merge(jax.tree.map(jnp.copy, state.params), jax.tree.map(jnp.copy, state.buffers))


def make(config: dict) -> ParityProgram:
    return ParityProgram(config)
