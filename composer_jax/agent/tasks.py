"""The protocol of an RL task family: what a new environment implements (no JAX).

A task family is one class, registered by name (`composer_jax.rl.tasks.register`), with its own
config section `rl.task` (a `TaskConfig` subclass: `--set rl.task=NAME` picks it, `--set
rl.task.KEY=VALUE` sets a field). Every process of a run (driver, trainer, inference service,
rollout workers) builds it from the run's config: `Family(cfg)`; constructing it must be cheap
and must not import JAX (rollout workers are JAX-free).

Required:
    name: str                        registered name (a plug-in module: its module path, `__name__`)
    config_cls: type[TaskConfig]     the section class; its `family` default is `name`
    make_tasks(split) -> list[str]   task ids of split "train" (trained on) or "eval" (held-out;
                                     never a training id; [] = no held-out episodes)
    run_episode(task_id, seed, policy, *, greedy) -> Rollout
                                     one episode on the policy server (`policy.call(...)`, see
                                     `agent.policy_client`), scored: the Rollout's reward has
                                     "total" (and "resolved" when it applies)
A single-turn family subclasses `SingleTurnFamily` instead of writing `run_episode`: it gives
`messages(task_id)` (the chat prompt) and `score(task_id, reply) -> (reward, resolved)`.

Optional hooks (defaults in `TaskFamily`):
    prepare(cfg) -> cfg              driver only, once, before anything is built: resolve task
                                     pools, the initial policy, the run's model (coding)
    tokenizer()                      the tokenizer of the prompts (default: the toy tokenizer of
                                     cfg.model.vocab_size, `agent.parity.toy_tokenizer`)
    initial_model()                  the policy's initial nnx model, or None (the default) for a
                                     fresh cfg.model from cfg.seed (`rl.initial_policy`, which
                                     also puts `train.init_from` first; JAX: trainer and
                                     inference side only)
    engine_settings() -> dict        EngineConfig fields of the policy server (max_len,
                                     prefill_batch)
    make_eval_fn()                   driver side: `eval_fn(model, version) -> dict` for the
                                     checkpoint evaluator, or None (`rl.family_eval.checkpoint_eval_fn`)
    heldout_on_checkpoints: bool     with no eval_fn of its own: True = the checkpoint evaluator
                                     runs the held-out tasks' episodes with each checkpoint's
                                     weights (`rl.family_eval.FamilyEvaluator`); False = the
                                     rollout workers run them on the policy server
    sample_prompts() -> list         a few chat prompts (lists of {"role", "content"}) that
                                     `generate` samples a run's checkpoints with (default: none;
                                     single-turn families: distinct held-out prompts)
    write_run_files(workdir)         driver side: WORKDIR/tokenizer.json (the prompts'
                                     tokenizer) and WORKDIR/prompts.json (`sample_prompts`), so
                                     `eval` / `generate` read the run like any other
"""
from __future__ import annotations

import functools
import json
import pathlib
from typing import ClassVar, Sequence

import numpy as np

from composer_jax.agent.parity import toy_tokenizer
from composer_jax.agent.policy_client import EngineClient, PolicyClient
from composer_jax.agent.rollout import END_EPISODE, Rollout, SegmentBuilder
from composer_jax.config.rl import TaskConfig
from composer_jax.data import special_tokens as st
from composer_jax.data.chat import encode_prompt
from composer_jax.protocol.params import SamplingParams

SPLITS = ("train", "eval")


class TaskFamily:
    """Base class of a task family (module docstring)."""
    name: ClassVar[str] = ""
    config_cls: ClassVar[type[TaskConfig]] = TaskConfig
    grades_code: ClassVar[bool] = False   # True: the reward runs agent code (needs the sandbox)
    heldout_on_checkpoints: ClassVar[bool] = False    # module docstring

    def __init__(self, cfg):
        self.cfg = cfg
        self.task_cfg = cfg.rl.task

    def make_tasks(self, split: str) -> list[str]:
        raise NotImplementedError(f"task family {self.name!r} must implement make_tasks(split)")

    def run_episode(self, task_id: str, seed: int, policy: PolicyClient, *,
                    greedy: bool) -> Rollout:
        raise NotImplementedError(f"task family {self.name!r} must implement run_episode")

    # ------------------------------------------------------------------ optional hooks

    @classmethod
    def prepare(cls, cfg):
        return cfg

    def tokenizer(self):
        return _toy_tokenizer(self.cfg.model.vocab_size)

    def initial_model(self):
        """None: a fresh cfg.model (`rl.initial_policy` builds it; this package imports no JAX)."""
        return None

    def engine_settings(self) -> dict:
        """One decode slot per rollout worker, rows of rl.seq_len, and prefill in calls of up to
        that many rows (single-turn prompts arrive together)."""
        rows = max(self.cfg.rl.job.num_rollout_workers, 1)
        return {"max_batch": rows, "max_len": self.cfg.rl.seq_len, "prefill_batch": rows}

    def make_eval_fn(self):
        return None

    def sample_prompts(self) -> list:
        return []

    def write_run_files(self, workdir) -> None:
        workdir = pathlib.Path(workdir)
        self.tokenizer().save(str(workdir / "tokenizer.json"))
        prompts = self.sample_prompts()
        if prompts:
            (workdir / "prompts.json").write_text(json.dumps(prompts))


@functools.lru_cache(maxsize=2)
def _toy_tokenizer(vocab_size: int):
    return toy_tokenizer(vocab_size)


class SingleTurnFamily(TaskFamily):
    """A family whose episode is one sampled reply to a chat prompt, scored by a rule."""

    def messages(self, task_id: str) -> list[dict]:
        raise NotImplementedError(f"task family {self.name!r} must implement messages(task_id)")

    def score(self, task_id: str, reply: str) -> tuple[float, bool]:
        raise NotImplementedError(f"task family {self.name!r} must implement score(task_id, reply)")

    def info(self, task_id: str) -> dict:
        """Extra JSON facts recorded in the rollout's info (beside the reply)."""
        return {}

    def sample_prompts(self, limit: int = 4) -> list:
        """Up to `limit` distinct chats of the held-out tasks (train tasks when there are none)."""
        chats: list = []
        for t in self.make_tasks("eval") or self.make_tasks("train"):
            m = self.messages(t)
            if m not in chats:
                chats.append(m)
            if len(chats) == limit:
                break
        return chats

    def run_episode(self, task_id: str, seed: int, policy: PolicyClient, *,
                    greedy: bool) -> Rollout:
        rl, tok = self.cfg.rl, self.tokenizer()
        ids = encode_prompt(tok, self.messages(task_id))
        params = SamplingParams(temperature=0.0 if greedy else rl.temperature,
                                max_new_tokens=rl.max_new_tokens,
                                stop_tokens=(tok.token_to_id(st.IM_END),), seed=seed)
        c = EngineClient(policy, rl.seq_len, self.cfg.model.vocab_size).generate(ids, params)
        reply = tok.decode(c.tokens)
        reward, resolved = self.score(task_id, reply)
        return single_turn_rollout(task_id, "", ids, c, reward, resolved,
                                   {"reply": reply, **self.info(task_id)})


def single_turn_rollout(task_id: str, group_id: str, prompt: Sequence[int], completion,
                        reward: float, resolved: bool, info: dict,
                        rollout_id: str = "") -> Rollout:
    """The exact record of one finished engine request on `prompt`: fed prompt ids, sampled ids
    with behaviour log-probs, raw model log-probs and versions, and the routed experts of every
    forward pass (prompt positions then sampled ones)."""
    b = SegmentBuilder()
    b.feed(prompt)
    b.sample(completion.tokens, completion.logprobs, completion.raw_logprobs, completion.versions)
    if completion.router_indices and completion.prompt_router_indices is not None:
        rows = np.concatenate([np.asarray(completion.prompt_router_indices),
                               np.stack(completion.router_indices)], axis=0)
        b.set_router(0, rows[:len(b) - 1])
    b.end_turn(completion.finish_reason or "stop_token")
    return Rollout(task_id, group_id, [b.build(END_EPISODE)],
                   {"total": reward, "resolved": float(resolved)}, rollout_id=rollout_id,
                   info=info)
