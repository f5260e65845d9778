"""The RL program of `rl.tasks=coding`: sandboxed coding episodes of the environment's task pool,
run by the token-level agent (`rl/agent.py` TokenAgent) against the engine service, graded by the
environment (`env.grading.grade_workspace`) and rewarded by `env.rewards.compute_reward`
(resolved, valid/invalid tool calls, the concave effort penalty, communication, out-of-scope edits,
false claims, tampering).

Sides (see `rl/program.py`):
- env side: the pool's training tasks (`split == "train"`); an episode opens a copy-on-write
  sandbox over the task's snapshot and runs the agent, whose engine is an `EngineClient` that
  forwards `submit` / `wait` / `end_session` to the policy server (in process, over a pipe or
  through Ray). The agent's sampling, stopping and rewards are exactly those of a local engine.
- inference side: the engine holding the initial policy (`init_from`: a training run's workdir,
  e.g. the cached `sft` run that `experiments/rl.py` builds; "" = a fresh `cfg.model`), with new
  versions applied in flight (`ParityPolicy.load_from`).
- trainer side: `rl_step` on the same initial weights (`ParityLearner` with this model).

Held-out evaluation is not run as program episodes (eval_tasks() is empty): the driver's
checkpoint evaluator calls the eval suite's runner on the trainer's weights (`experiments/rl.py`
passes `composer_jax.eval.api.eval_resolved_rate`).

kwargs (JSON, so every process rebuilds the same program): config (the resolved Config as a dict),
pool_dir (the task pool), init_from (weights), tokenizer (a tokenizer.json path).
"""
from __future__ import annotations

import functools
import pathlib
import types

import numpy as np

from composer_jax.errors import ConfigError
from composer_jax.rl.parity_program import ParityLearner, ParityPolicy, _config


@functools.lru_cache(maxsize=4)
def _tokenizer(path: str):
    from composer_jax.data.tokenizer import load_tokenizer
    return load_tokenizer(pathlib.Path(path))


class CodingProgram:
    def __init__(self, config: dict, pool_dir: str, init_from: str, tokenizer: str):
        from composer_jax.env.tasks.pool import TaskPool
        self.cfg = _config(config)
        self.pool_dir, self.init_from, self.tokenizer_path = pool_dir, init_from, tokenizer
        self.pool = TaskPool(pathlib.Path(pool_dir))
        tasks = sorted((t for t in self.pool.tasks() if t.split == "train"), key=lambda t: t.task_id)
        if not tasks:
            raise ConfigError(f"rl.tasks=coding: the task pool {pool_dir} holds no training tasks; "
                              f"build one with --experiment=env_generate or set env.pool_dir")
        self._tasks = {t.task_id: t for t in tasks[:self.cfg.rl.num_train_tasks]}

    # ---------------------------------------------------------------- env side

    def train_tasks(self) -> list[str]:
        return list(self._tasks)

    def eval_tasks(self) -> list[str]:
        return []            # held-out evaluation: the eval suite, by the checkpoint evaluator

    def agent_config(self, greedy: bool):
        from composer_jax.rl.agent import AgentConfig
        rl = self.cfg.rl
        return AgentConfig.from_config(self.cfg, max_new_tokens=rl.max_new_tokens,
                                       temperature=0.0 if greedy else rl.temperature,
                                       record_messages=False)

    def run_episode(self, task_id: str, seed: int, policy, *, greedy: bool):
        from composer_jax.rl.agent import TokenAgent
        task = self._tasks[task_id]
        engine = EngineClient(policy, _engine_len(self.cfg), self.cfg.model.vocab_size)
        agent = TokenAgent(engine, _tokenizer(self.tokenizer_path), self.agent_config(greedy),
                           self.cfg.env, policy=_seeded(seed))
        # a crashed episode comes back as an error rollout (reward 0, reason kept), never raises
        return agent.run(task, self.pool.task_dir(task_id))

    # ---------------------------------------------------------------- inference side

    def make_policy(self):
        return CodingPolicy(self.cfg, self._model())

    # ---------------------------------------------------------------- trainer side

    def make_learner(self):
        return ParityLearner(self.cfg, make_model=self._model)

    def _model(self):
        """The initial policy: `init_from` (a run workdir) or a fresh cfg.model."""
        from composer_jax.train.weights import load_weights
        w = load_weights(self.init_from, self.cfg)
        if w.model_cfg.vocab_size != self.cfg.model.vocab_size:
            raise ConfigError(f"rl.init_from={self.init_from!r} has vocab {w.model_cfg.vocab_size}, "
                              f"the run's model.vocab_size is {self.cfg.model.vocab_size}")
        return w.model()


def _engine_len(cfg) -> int:
    """The engine's context: one less than the trainer's rows (`rl.seq_len`), because a turn cut
    at the context limit is closed by the agent with one more (fed) <|im_end|>; a full context
    would otherwise make a 3073-token segment in 3072-token rows."""
    return cfg.rl.seq_len - 1


def _seeded(seed: int):
    """The agent's turn policy: configured sampling with a PRNG seed fixed per (episode, turn), so
    a sample does not depend on which requests share the engine's batch (and a re-run episode
    samples the same tokens)."""
    import dataclasses

    def policy(request):
        kind = 1 if request.kind == "summary" else 0
        return dataclasses.replace(request.params, seed=(int(seed) * 100_003 + 2 * request.turn_index
                                                         + kind) % (2 ** 31))
    return policy


class EngineClient:
    """What TokenAgent needs of an engine (`submit`, `wait`, `end_session`, `cfg.max_len`,
    `model_cfg.vocab_size`), served by the policy server through a PolicyClient."""

    def __init__(self, policy, max_len: int, vocab_size: int):
        self.policy = policy
        self.cfg = types.SimpleNamespace(max_len=max_len)
        self.model_cfg = types.SimpleNamespace(vocab_size=vocab_size)

    def submit(self, prompt, params, session=None) -> int:
        return self.policy.call("submit", [int(t) for t in prompt], params, session)

    def wait(self, request_id: int, timeout=None):
        c = self.policy.call("wait", request_id, timeout)
        return types.SimpleNamespace(**c)

    def end_session(self, session: str) -> None:
        self.policy.call("end_session", session)


def completion_fields(c) -> dict:
    """A Completion as plain fields (what crosses a pipe or Ray)."""
    return {"tokens": list(c.tokens), "logprobs": list(c.logprobs),
            "raw_logprobs": list(c.raw_logprobs), "versions": list(c.versions),
            "router_indices": [np.asarray(r) for r in c.router_indices],
            "prompt_router_indices": (None if c.prompt_router_indices is None
                                      else np.asarray(c.prompt_router_indices)),
            "prompt_router_start": int(c.prompt_router_start),
            "finish_reason": c.finish_reason}


class CodingPolicy(ParityPolicy):
    """The engine as a policy server for multi-turn sessions: rpc "submit" (feed ids to a session,
    sample a turn) -> request id, "wait" -> completion fields, "end_session".

    Prefill runs one row per call: episodes start and return from their tools at different times,
    so a feed rarely has company, and a call of `num_rollout_workers` padded rows (the parity
    policy's setting) spent that many times the work on every ~2.2k-token prompt and every tool
    result (measured: 19 episodes in 12 minutes with 16 padded rows on 2 cores)."""

    @staticmethod
    def engine_config(cfg):
        """The parity policy's engine settings with a context of `_engine_len` and one-row prefill."""
        import dataclasses
        return dataclasses.replace(ParityPolicy.engine_config(cfg), max_len=_engine_len(cfg),
                                   prefill_batch=1)

    def rpc(self, method: str, args: tuple, kwargs: dict):
        if method == "submit":
            ids, params, session = args
            self._enter()
            try:
                fut = self.engine.request(ids, params, session=session)
            except BaseException:
                self._exit()
                raise
            fut.add_done_callback(lambda _: self._exit())
            return fut.request_id
        if method == "wait":
            request_id, timeout = args
            return completion_fields(self.engine.wait(request_id, timeout=timeout))
        if method == "end_session":
            self.engine.end_session(args[0])
            return None
        return super().rpc(method, args, kwargs)


def make(config: dict, pool_dir: str, init_from: str, tokenizer: str) -> CodingProgram:
    return CodingProgram(config, pool_dir, init_from, tokenizer)
