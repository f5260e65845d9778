"""rl.task=composer_jax.rl.tasks.lookup_long: lookup chains longer than the context window, so the
policy must self-summarise to finish (README "Self-summarisation in a real run").

Tasks, tools and grading: `agent.lookup_long` (chains of `rl.task.hops` = (easy, hard) long notes,
held-out prompt keys). Episodes run in the token agent's loop like `rl.task=lookup`, with
self-summarisation at `rl.summary_trigger_tokens` (a summary turn of at most
`rl.task.summary_max_tokens` tokens, written by the policy; each segment is a training sample
sharing the episode's reward, so the summary tokens are trained with it). Set the window with
`rl.seq_len` and the trigger below it (benchmarks/rl_summarize.py: seq_len 256, trigger 200):
a hard chain then needs at least one summary; `rl.summary_trigger_tokens=0` runs the same policy
truncated at the window (the episode ends "context_full").

Each rollout's info holds the policy's summaries (`summaries`) and whether each names the optimal
next step (`summaries_correct`, `agent.lookup_long.summary_correct`).

The initial policy: a fresh tiny MoE after `rl.task.sft_steps` LM steps on the segments of
scripted optimal episodes of training tasks (`agent.lookup_long.Oracle` forced through the same
token agent, summary turns included, so the SFT rows are exactly what the agent feeds and
samples), cached like the lookup family's SFT.
"""
from __future__ import annotations

import dataclasses
import random

from composer_jax.agent import lookup_long as ll
from composer_jax.agent.forced_engine import ForcedEngine
from composer_jax.agent.lookup import NoteBook
from composer_jax.agent.token_agent import ScriptedPolicy, TokenAgent
from composer_jax.config.rl import LookupTaskConfig
from composer_jax.data.targets import add_targets
from composer_jax.errors import ConfigError
from composer_jax.rl.tasks.lookup import LookupFamily
from composer_jax.rl.tasks.registry import register


@dataclasses.dataclass(frozen=True)
class LookupLongTaskConfig(LookupTaskConfig):
    """The lookup section plus hops (chain length of easy, hard tasks), filler (noise words per
    note), summary_max_tokens (length of a summary turn) and letter_codes (codes are two letters
    like a key instead of a digit); the length term off by default."""
    family: str = __name__
    num_train_tasks: int = 256
    num_eval_tasks: int = 128
    max_turns: int = 8
    levels: tuple[str, ...] = ("easy", "hard")
    sft_steps: int = 500
    sft_hasty: float = 0.0
    length_weights: tuple[float, ...] = (0.0, 0.0)
    hops: tuple[int, ...] = (1, 4)
    filler: int = 12
    summary_max_tokens: int = 12
    letter_codes: bool = False

    def __post_init__(self):
        super().__post_init__()
        if len(self.hops) != 2 or min(self.hops) < 1 or self.filler < 0 \
                or self.summary_max_tokens < 1:
            raise ConfigError(f"rl.task.hops must be two chain lengths >= 1, filler >= 0 and "
                              f"summary_max_tokens >= 1; got {self.hops}, {self.filler}, "
                              f"{self.summary_max_tokens}")


@register
class LookupLongFamily(LookupFamily):
    name = __name__
    config_cls = LookupLongTaskConfig

    def __init__(self, cfg):
        super().__init__(cfg)
        t = self.task_cfg
        self._split = {s: self._make(n, cfg.seed, s) for s, n in
                       (("train", t.num_train_tasks), ("eval", t.num_eval_tasks))}
        self._tasks = {x.task_id: x for split in self._split.values() for x in split}

    def _make(self, n: int, seed: int, split: str) -> list:
        t = self.task_cfg
        return ll.make_tasks(n, seed, split, tuple(t.levels), tuple(t.hops), t.filler,
                             t.letter_codes)

    def tokenizer(self):
        return ll.long_tokenizer(self.cfg.model.vocab_size)

    def agent_config(self, greedy: bool):
        return dataclasses.replace(super().agent_config(greedy), record_messages=True,
                                   summary_max_tokens=self.task_cfg.summary_max_tokens)

    def _score(self, agent, task, book, ep) -> dict:
        reward = super()._score(agent, task, book, ep)
        summaries = [seg[-1]["content"] for seg in ep.messages[:-1]]
        ep.info.update(summaries=summaries, summaries_correct=[
            ll.summary_correct(task, s, seg[:-1]) for s, seg in zip(summaries, ep.messages)])
        return reward

    def scripted_episode(self, task, seed: int = 0):
        """An optimal episode of `task` (`agent.lookup_long.Oracle`) through the token agent on a
        forced engine: the SFT data (exact fed and sampled ids, summary turns included)."""
        engine = ForcedEngine(self.engine_settings()["max_len"], self.cfg.model.vocab_size)
        oracle = ll.Oracle(task)
        agent = TokenAgent(engine, self.tokenizer(), self.agent_config(greedy=True),
                           self.env_cfg, policy=ScriptedPolicy(oracle, self.tokenizer(),
                                                               oracle.summary))
        r = agent.run_on(ll_book(task), task.messages(), task.task_id,
                         lambda book, ep: self._score(agent, task, book, ep))
        if r.error is not None:
            raise RuntimeError(f"scripted episode of {task.task_id} failed: {r.error}")
        return r

    def initial_model(self):
        from composer_jax.rl.tasks.lookup_sft import initial_model  # JAX: not in rollout workers
        t = self.task_cfg
        tasks = self._make(t.num_train_tasks, t.sft_seed, "train")
        salt = (f"long-v2-{t.hops}-{t.filler}-" + ("letters-" if t.letter_codes else "")
                + f"{self.cfg.rl.summary_trigger_tokens}-{t.summary_max_tokens}")
        return initial_model(self.cfg, tasks, salt=salt, train=self._sft)

    def _sft(self, cfg, tasks, steps: int, lr: float = 3e-3, batch: int = 16):
        """`lookup_sft.lm_policy` on rows of the segments of scripted optimal episodes of `tasks`
        (each row one segment, loss on its sampled tokens)."""
        import numpy as np

        from composer_jax.rl.tasks.lookup_sft import lm_policy  # JAX: not in rollout workers
        segs = [s for t in tasks for s in self.scripted_episode(t).segments]
        width = -(-max(len(s) for s in segs) // 16) * 16
        rng = random.Random(cfg.rl.task.sft_seed)

        def batches():
            for _ in range(steps):
                rows = {k: np.zeros((batch, width), np.int32)
                        for k in ("tokens", "segment_ids", "positions", "trainable")}
                for i in range(batch):
                    s = rng.choice(segs)
                    n = len(s)
                    rows["tokens"][i, :n], rows["trainable"][i, :n] = s.tokens, s.trainable
                    rows["segment_ids"][i, :n], rows["positions"][i, :n] = 1, np.arange(n)
                yield add_targets(rows, 0)
        return lm_policy(cfg, batches(), steps, lr)

    def sample_prompts(self, limit: int = 4) -> list:
        return [t.messages() for t in self._split["eval"][:limit]]


def ll_book(task):
    """The in-process tools over a long task's notes (`agent.lookup.NoteBook`)."""
    return NoteBook(task)
