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
import random
import time
from typing import Sequence

import numpy as np

from composer_jax.data import special_tokens as st
from composer_jax.env import protocol
from composer_jax.rl.rollout import END_EPISODE, Rollout, SegmentBuilder

SYSTEM = "Reply with characters of the requested parity."
KINDS = ("even", "odd")
_SPLIT_SEED = {"train": 0, "eval": 1_000_003}


@dataclasses.dataclass(frozen=True)
class ToyTask:
    task_id: str
    kind: str          # "even" or "odd"
    nonce: int

    def messages(self) -> list[dict]:
        return [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": self.kind}]


def make_tasks(n: int, seed: int = 0, split: str = "train",
               kinds: Sequence[str] = KINDS) -> list[ToyTask]:
    """n tasks, kinds cycling through `kinds` (even, odd, even, ...: any 2m consecutive tasks are
    balanced); `split` "train" and "eval" never share a task id. kinds=("even",) is the
    unconditional variant (the CI learning check: no need to read the prompt)."""
    if split not in _SPLIT_SEED:
        raise ValueError(f"split must be one of {sorted(_SPLIT_SEED)}, got {split!r}")
    if not kinds or any(k not in KINDS for k in kinds):
        raise ValueError(f"kinds must be a non-empty subset of {KINDS}, got {kinds!r}")
    rng = random.Random(seed + _SPLIT_SEED[split])
    nonces = rng.sample(range(1000), n) if split == "train" else rng.sample(range(1000, 2000), n)
    return [ToyTask(f"parity-{split}-{kinds[i % len(kinds)]}-{x}", kinds[i % len(kinds)], x)
            for i, x in enumerate(nonces)]


def grade(task: ToyTask, reply: str) -> tuple[float, bool]:
    """(reward, resolved) of an assistant reply: reward = fraction of the final message's
    characters with the task's parity (0 for an empty message), resolved = reward == 1."""
    content = protocol.parse_assistant(reply).content
    if protocol.TOOL_CALLS_BEGIN in reply or protocol.TOOL_CALL_BEGIN in reply or not content:
        return 0.0, False
    want = 0 if task.kind == "even" else 1
    score = sum(ord(c) % 2 == want for c in content) / len(content)
    return float(score), score == 1.0


def toy_tokenizer(vocab_size: int = 320):
    """A byte-level BPE (the project's `train_tokenizer`) trained on the task text; deterministic."""
    from composer_jax.data.config import SplitPattern
    from composer_jax.data.tokenizer import train_tokenizer
    texts = [protocol.render_prompt(t.messages()) for t in make_tasks(200, 0)]
    texts += ["abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789"] * 4
    return train_tokenizer(texts, vocab_size, SplitPattern.KIMI)


def toy_model_config(vocab_size: int = 320):
    """The `tiny` model with the toy tokenizer's vocabulary (and no MTP: the RL step skips it)."""
    from composer_jax.config import tiny
    return dataclasses.replace(tiny(), name="tiny_toy", vocab_size=vocab_size, mtp_depth=0)


def toy_config(lr: float = 3e-3, seed: int = 0, **rl):
    """The Config of the toy runs: `toy_model_config`, Adam at a constant `lr` without weight
    decay, Dr.GRPO with truncated IS and loss_normalizer 64 (about the tokens of one step);
    `rl` overrides RLConfig fields."""
    from composer_jax.config import Config, RLConfig, TrainConfig
    return Config(model=toy_model_config(), seed=seed,
                  rl=RLConfig(**{"loss_normalizer": 64.0, **rl}),
                  train=TrainConfig(lr=lr, warmup_steps=0, steps=10_000, schedule="constant",
                                    weight_decay=0.0, grad_clip=1.0))


def prompt_ids(tokenizer, task: ToyTask) -> list[int]:
    """BOS + the chat template of the task + the assistant generation prompt."""
    from composer_jax.data.chat import encode_prompt
    return encode_prompt(tokenizer, task.messages())


def rollout_from_completion(task: ToyTask, group_id: str, prompt: Sequence[int], completion,
                            tokenizer, rollout_id: str = "") -> Rollout:
    """The exact record of one finished engine request on `prompt`: fed prompt ids, sampled ids
    with behaviour log-probs, raw model log-probs and versions, and the routed experts of every
    forward pass (prompt positions then sampled ones), graded by `grade`."""
    b = SegmentBuilder()
    b.feed(prompt)
    b.sample(completion.tokens, completion.logprobs, completion.raw_logprobs, completion.versions)
    if completion.router_indices and completion.prompt_router_indices is not None:
        rows = np.concatenate([np.asarray(completion.prompt_router_indices),
                               np.stack(completion.router_indices)], axis=0)
        b.set_router(0, rows[:len(b) - 1])
    b.end_turn(completion.finish_reason or "stop_token")
    reply = tokenizer.decode(completion.tokens)
    reward, resolved = grade(task, reply)
    return Rollout(task.task_id, group_id, [b.build(END_EPISODE)],
                   {"total": reward, "resolved": float(resolved)}, rollout_id=rollout_id,
                   info={"reply": reply, "kind": task.kind})


def sampling_params(tokenizer, max_new_tokens: int = 6, temperature: float = 1.0,
                    seed: int | None = None):
    """The engine sampling of a toy turn: stops at `<|im_end|>` or after max_new_tokens."""
    from composer_jax.inference.sampling import SamplingParams
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
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from composer_jax.inference.config import EngineConfig
    from composer_jax.inference.engine import Engine
    from composer_jax.model import init_model
    from composer_jax.rl.batch import make_batch
    from composer_jax.rl.step import build_rl_step

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
                           router_replay=cfg.rl.router_replay)
        state, metrics = fns.rl_step(state, batch)
        metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
        engine.swap_weights(engine_state(state.params, state.buffers)[1], version=i + 1)
        row = {"step": i, **metrics, "sample_s": t1 - t0, "train_s": time.monotonic() - t1}
        history.append(row)
        if log is not None:
            log(row)
    return history
