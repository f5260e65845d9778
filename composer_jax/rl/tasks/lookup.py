"""rl.task=lookup (the default of `rl_async`): multi-turn, tool-using episodes of the lookup family
(`composer_jax.agent.lookup`: read the note the prompt names with read_file, follow it, finish
with its code), with a held-out split of prompt keys never trained on.

- env side (no JAX): the token-level agent's episode loop (`agent.token_agent.TokenAgent.run_on`,
  the same loop as coding episodes and the text-level env episodes) over the task's `NoteBook`
  (the repository's `read_file` / `finish` interfaces served in-process: a sandbox adds nothing
  to a dictionary lookup), turns sampled with a seed per (episode, turn), up to
  `rl.task.max_turns` turns. The `Rollout` is exact (fed and sampled ids, behaviour log-probs,
  versions, routed experts).
- reward (`env.rewards.compute_reward`, weights of the run's `env` section: `lookup_env_config`
  for the rl_async default): resolved = the finish message is the code; the claim of success is
  finish's `success` argument (false-claim penalty, communication bonus); the length term is
  concave in real generated tokens, scaled per level by `rl.task.length_weights` (difficulty-
  aware: easy tasks pay for length, hard ones do not).
- inference and trainer side: the SFT initial policy (`rl/tasks/lookup_sft.py`).
- held-out evaluation (`heldout_on_checkpoints`): `rl.family_eval.FamilyEvaluator` (episodes
  of every held-out task with exactly the evaluated version's weights), also behind
  `--experiment=eval --set eval.policy=WORKDIR[@V]`.
"""
from __future__ import annotations

import dataclasses

from composer_jax.agent import lookup as lk
from composer_jax.agent.policy_client import EngineClient
from composer_jax.agent.tasks import TaskFamily
from composer_jax.agent.token_agent import AgentConfig, SeededTurns, TokenAgent
from composer_jax.config import tiny
from composer_jax.config.env import EnvConfig
from composer_jax.config.rl import LookupTaskConfig
from composer_jax.env.rewards import compute_reward
from composer_jax.rl.tasks.registry import register


def lookup_model_config(vocab_size: int = lk.VOCAB_SIZE):
    """The `tiny` MoE with the family's vocabulary and no MTP (the RL step skips it)."""
    return dataclasses.replace(tiny(), name="tiny_lookup", vocab_size=vocab_size, mtp_depth=0)


def lookup_env_config():
    """The `env` section of lookup runs: the effort x is the real generated tokens (content, tool
    calls, final message; tool outputs, calls and turns weigh 0), with C(x) concave (q = 0.5,
    k = 0.05) and a weight that matters at this scale: 0.01 * C(x) is 0.29 for a minimal easy
    episode (40 tokens) and grows by ~0.03 per 5 extra tokens there."""
    return dataclasses.replace(
        EnvConfig(), reward_length_coef=0.01, reward_length_k=0.05, reward_length_q=0.5,
        reward_length_token_weight=1.0, reward_length_tool_call_token_weight=1.0,
        reward_length_final_weight=1.0, reward_length_tool_output_weight=0.0,
        reward_length_call_weight=0.0, reward_length_turn_weight=0.0)


@register
class LookupFamily(TaskFamily):
    name = "lookup"
    config_cls = LookupTaskConfig
    resumable = True            # episodes checkpoint every turn and resume (agent.episode_checkpoint)
    heldout_on_checkpoints = True   # rl.family_eval.FamilyEvaluator scores the checkpoints

    def __init__(self, cfg):
        super().__init__(cfg)
        t = self.task_cfg
        levels = tuple(t.levels)
        self._split = {"train": lk.make_tasks(t.num_train_tasks, cfg.seed, "train", levels),
                       "eval": lk.make_tasks(t.num_eval_tasks, cfg.seed, "eval", levels)}
        self._tasks = {x.task_id: x for split in self._split.values() for x in split}
        self.env_cfg = dataclasses.replace(cfg.env, max_turns=t.max_turns)

    def make_tasks(self, split: str) -> list[str]:
        return [t.task_id for t in self._split[split]]

    def task(self, task_id: str) -> lk.LookupTask:
        return self._tasks[task_id]

    def tokenizer(self):
        return lk.lookup_tokenizer(self.cfg.model.vocab_size)

    def engine_settings(self) -> dict:
        """Rows of rl.seq_len (the engine's context one less: a cut turn is closed with a fed
        <|im_end|>) and one-row prefill (turns return from their tools at different times)."""
        return {**super().engine_settings(), "max_len": self.cfg.rl.seq_len - 1,
                "prefill_batch": 1}

    def run_episode(self, task_id, seed, policy, *, greedy, checkpoint=None, resume=None):
        engine = EngineClient(policy, self.engine_settings()["max_len"], self.cfg.model.vocab_size)
        return self.episode(engine, self._tasks[task_id], seed, greedy=greedy,
                            checkpoint=checkpoint, resume=resume)

    def episode(self, engine, task: lk.LookupTask, seed: int, *, greedy: bool, checkpoint=None,
                resume=None):
        """One episode of `task` on `engine` (`submit`/`wait`/`end_session`, `cfg.max_len`,
        `model_cfg.vocab_size`: the policy server's EngineClient, or a scripted engine in tests);
        `checkpoint`/`resume`: `TokenAgent.run_on`."""
        agent = TokenAgent(engine, self.tokenizer(), self.agent_config(greedy), self.env_cfg,
                           policy=SeededTurns(seed))
        r = agent.run_on(self.notebook(task), task.messages(), task.task_id,
                         lambda book, ep: self._score(agent, task, book, ep),
                         checkpoint=checkpoint, resume=resume)
        r.info.update(level=task.level, key=task.key)
        return r

    def notebook(self, task: lk.LookupTask) -> lk.NoteBook:
        """The tools of one episode of `task` (a variant may serve its notes differently)."""
        return lk.NoteBook(task)

    def agent_config(self, greedy: bool) -> AgentConfig:
        """The token agent's settings of this family's episodes."""
        rl = self.cfg.rl
        return AgentConfig(max_new_tokens=rl.max_new_tokens,
                           temperature=0.0 if greedy else rl.temperature,
                           summary_trigger_tokens=rl.summary_trigger_tokens,
                           include_tool_specs=False, record_messages=False,
                           resume_replay=rl.resume_mode.value == "replay")

    def _score(self, agent: TokenAgent, task: lk.LookupTask, book: lk.NoteBook, ep) -> dict:
        """The reward of a finished episode (module docstring); facts into `ep.info`."""
        g = lk.grade(task, book)
        weight = dict(zip(lk.LEVELS, self.task_cfg.length_weights))[task.level]
        r = compute_reward(resolved=g.correct, f2p_fraction=0.0, num_calls=book.num_calls,
                           num_invalid_calls=book.num_invalid_calls, num_tokens=ep.generated,
                           num_turns=ep.turns, changed_files=(), editable_files=(),
                           final_message=g.message, cfg=self.env_cfg,
                           counts=agent.effort_counts(ep), claimed=g.claimed,
                           length_weight=weight)
        ep.info.update({"num_calls": book.num_calls, "num_invalid_calls": book.num_invalid_calls,
                        "reads": list(book.reads), "claimed": g.claimed, "resolved": g.correct,
                        "finished": g.finished})
        return dataclasses.asdict(r)

    def initial_model(self):
        # deferred: the SFT policy is JAX (trainer and inference side); workers build this family
        from composer_jax.rl.tasks.lookup_sft import initial_model
        return initial_model(self.cfg)

    def sample_prompts(self, limit: int = 4) -> list:
        return [t.messages() for t in self._split["eval"][:limit]]
