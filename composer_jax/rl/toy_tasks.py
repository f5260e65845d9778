"""A task family with a known optimum that runs through the real RL path, cheap enough to learn on
a laptop CPU: the "parity" tasks.

Each task asks for a reply whose characters all have a given parity of their code point:

    system: "Reply with characters of the requested parity."
    user:   "even"                              -> reward = fraction of the reply's characters c
                                                    with ord(c) % 2 == 0
The reply is the final message of the protocol (`env.protocol.parse_assistant(text).content`), so
a reply that opens a tool-call section or is empty scores 0. Known optimum: reward 1.0 (every
character of the right parity, e.g. "bdfh" for even); a uniform random policy scores about 0.5.
The grade is a rule (`grade`), nothing the policy can touch.

The episodes go through the same path as the coding tasks: the chat template (`data.chat`),
engine *sessions* (`inference.Engine`, router capture on), exact `Rollout` records (sampled ids,
behaviour log-probs, versions, routed experts per position) and `rl_step`.

Public API (what `rl_async` builds on):
    make_tasks(n, seed, split)        -> list[ToyTask]       the generator (train/eval disjoint)
    grade(task, reply)                -> (reward, resolved)  the rule
    toy_tokenizer()                   -> Tokenizer           byte-level BPE with the specials
    toy_model_config(vocab_size)      -> ModelConfig         `tiny` with the tokenizer's vocab
    toy_config(lr, seed, **rl)        -> Config              the settings of the learning runs
    prompt_ids(tokenizer, task)       -> list[int]           BOS + chat template + generation prompt
    run_episode(engine, tokenizer, task, group_id=, rollout_id=) -> Rollout  one episode
    run_group(engine, tokenizer, tasks, group_size, ...) -> list[Rollout]  (G episodes per task)
    rollout_from_completion(...)      -> Rollout             one finished engine request
    train_toy(...)                    -> list[dict]          the whole loop (sample, train, swap)

Shape glossary: Lm MoE layers, K experts per token.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from composer_jax.agent.parity import (KINDS, SYSTEM, ToyTask, grade, make_tasks,  # noqa: F401
                                       prompt_ids, toy_tokenizer)
from composer_jax.agent.rollout import Rollout
from composer_jax.agent.tasks import single_turn_rollout
from composer_jax.config import Config, RLConfig, TrainConfig, tiny
from composer_jax.data import special_tokens as st
from composer_jax.inference.config import EngineConfig
from composer_jax.inference.engine import Engine
from composer_jax.inference.sampling import SamplingParams
from composer_jax.model import init_model
from composer_jax.rl.batch import make_batch, replays_routers
from composer_jax.rl.step import build_rl_step


def toy_model_config(vocab_size: int = 320):
    """The `tiny` model with the toy tokenizer's vocabulary (and no MTP: the RL step skips it)."""
    return dataclasses.replace(tiny(), name="tiny_toy", vocab_size=vocab_size, mtp_depth=0)


def toy_config(lr: float = 3e-3, seed: int = 0, **rl):
    """The Config of the toy runs: `toy_model_config`, Adam at a constant `lr` without weight
    decay, Dr.GRPO with truncated IS and loss_normalizer 64 (about the tokens of one step);
    `rl` overrides RLConfig fields."""
    return Config(model=toy_model_config(), seed=seed,
                  rl=RLConfig(**{"loss_normalizer": 64.0, **rl}),
                  train=TrainConfig(lr=lr, warmup_steps=0, steps=10_000, schedule="constant",
                                    weight_decay=0.0, grad_clip=1.0))


def rollout_from_completion(task: ToyTask, group_id: str, prompt: Sequence[int], completion,
                            tokenizer, rollout_id: str = "") -> Rollout:
    """The exact record of one finished engine request on `prompt`
    (`agent.tasks.single_turn_rollout`), graded by `grade`."""
    reply = tokenizer.decode(completion.tokens)
    reward, resolved = grade(task, reply)
    return single_turn_rollout(task.task_id, group_id, prompt, completion, reward, resolved,
                               {"reply": reply, "kind": task.kind}, rollout_id=rollout_id)


def sampling_params(tokenizer, max_new_tokens: int = 6, temperature: float = 1.0,
                    seed: int | None = None):
    """The engine sampling of a toy turn: stops at `<|im_end|>` or after max_new_tokens."""
    return SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens,
                          stop_tokens=(tokenizer.token_to_id(st.IM_END),), seed=seed)


def run_episode(engine, tokenizer, task: ToyTask, *, group_id: str, rollout_id: str,
                max_new_tokens: int = 6, temperature: float = 1.0,
                seed: int | None = None) -> Rollout:
    """One episode of `task` in its own engine session (started engine or not: `Engine.wait`
    steps it when no driver runs) -> its graded Rollout. Thread-safe like the engine."""
    ids = prompt_ids(tokenizer, task)
    rid = engine.submit(ids, sampling_params(tokenizer, max_new_tokens, temperature, seed),
                        session=rollout_id)
    try:
        c = engine.wait(rid)
    finally:
        engine.end_session(rollout_id)
    return rollout_from_completion(task, group_id, ids, c, tokenizer, rollout_id=rollout_id)


def run_group(engine, tokenizer, tasks: Sequence[ToyTask], group_size: int, *,
              max_new_tokens: int = 6, temperature: float = 1.0, step: int = 0) -> list[Rollout]:
    """group_size episodes of every task on `engine`, all submitted before any is awaited (so they
    decode together), each in its own engine session -> rollouts; group id = task id/step."""
    params = sampling_params(tokenizer, max_new_tokens, temperature)
    jobs = []
    for t in tasks:
        ids = prompt_ids(tokenizer, t)
        for g in range(group_size):
            session = f"{t.task_id}/{step}/{g}"
            jobs.append((t, ids, session, engine.submit(ids, params, session=session)))
    out = []
    for t, ids, session, rid in jobs:
        c = engine.wait(rid)
        engine.end_session(session)
        out.append(rollout_from_completion(t, f"{t.task_id}/{step}", ids, c, tokenizer,
                                           rollout_id=session))
    return out


def train_toy(cfg, *, steps: int, tasks_per_step: int = 4, group_size: int = 8,
              seq_len: int = 64, max_new_tokens: int = 6, kinds: Sequence[str] = KINDS,
              log=None) -> list[dict]:
    """Trains a fresh `toy_model_config` policy on the parity tasks for `steps` RL steps: sample
    groups on the engine (router capture on), `make_batch`, `rl_step`, swap the new weights into
    the engine. Returns one metrics dict per step (reward_mean before the update, ...).

    cfg: a Config whose `model` is `toy_model_config(...)` and whose `rl` / `train` sections set
    the objective and optimiser."""
    tok = toy_tokenizer(cfg.model.vocab_size)
    if tok.vocab_size != cfg.model.vocab_size:
        raise ValueError(f"model.vocab_size={cfg.model.vocab_size} but the toy tokenizer has "
                         f"{tok.vocab_size} ids; use toy_model_config(tokenizer.vocab_size)")
    model = init_model(cfg.model, cfg.seed, cfg.execution, cfg.train.init_std)
    fns, state = build_rl_step(model, cfg)
    n_rows = tasks_per_step * group_size
    def engine_state(params, buffers):   # a copy: rl_step donates (and so frees) its state
        graphdef, st_ = nnx.split(fns.merge(params, buffers))
        return graphdef, jax.tree.map(jnp.copy, st_)

    engine = Engine(*engine_state(state.params, state.buffers), EngineConfig(max_batch=n_rows, max_len=seq_len,
                                                   capture_router=cfg.rl.router_replay,
                                                   prefill_batch=n_rows, seed=cfg.seed))
    pool = make_tasks(64, cfg.seed, kinds=kinds)
    history = []
    for i in range(steps):
        t0 = time.monotonic()
        tasks = [pool[(i * tasks_per_step + j) % len(pool)] for j in range(tasks_per_step)]
        rollouts = run_group(engine, tok, tasks, group_size, max_new_tokens=max_new_tokens,
                             step=i)
        t1 = time.monotonic()
        batch = make_batch(rollouts, seq_len=seq_len, batch_size=n_rows,
                           router_replay=replays_routers(cfg))
        state, metrics = fns.rl_step(state, batch)
        metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
        engine.swap_weights(engine_state(state.params, state.buffers)[1], version=i + 1)
        row = {"step": i, **metrics, "sample_s": t1 - t0, "train_s": time.monotonic() - t1}
        history.append(row)
        if log is not None:
            log(row)
    return history
