"""rl.task=composer_jax.rl.tasks.lookup_levels: the lookup family with the level stated in the
prompt, for the difficulty-aware length penalty (README "Difficulty-aware length").

The same tasks, notes, tools, grading and reward as `rl.task=lookup` (`rl/tasks/lookup.py`), both
levels by default, with one difference: the user message names the level,

    user: "Level easy. Note CG."      (read CG, finish)
    user: "Level hard. Note CG."      (read CG, follow its pointer, finish)

so the policy can condition what it writes before its first tool call on the level. In the plain
family the level shows only in the first tool result, after the preamble RL shortens, so the
easy level's length signal shortened hard episodes as well (benchmarks/results/rl_length.txt,
earlier runs). The length term stays difficulty-aware through `rl.task.length_weights` (easy, hard).

The initial policy is the plain family's SFT (`rl/tasks/lookup_sft.py`) on demonstrations of these
prompts (a separate cache entry). Each demonstration writes one optional thought (none or one of
`lookup.PREAMBLES`, the same texts and odds on both levels) before one of its tool calls:
`rl.task.thought_turn=first` before the first call on both levels (the plain family's
demonstrations), `decision` where each level's answer is decided: before an easy task's only read,
and before a hard task's second read (after the pointer is revealed). Either way the initial
policy writes as many optional tokens on both levels.
"""
from __future__ import annotations

import dataclasses
import functools

from composer_jax.agent import lookup as lk
from composer_jax.config.rl import LookupTaskConfig
from composer_jax.rl.tasks import register
from composer_jax.rl.tasks.lookup import LookupFamily


@dataclasses.dataclass(frozen=True)
class StatedLevelTask(lk.LookupTask):
    """A lookup task whose user message states its level."""

    def messages(self) -> list[dict]:
        return [{"role": "system", "content": lk.SYSTEM},
                {"role": "user", "content": f"Level {self.level}. Note {self.key}."}]


THOUGHT_TURNS = ("first", "decision")


def demonstration(task: lk.LookupTask, rng, hasty: float = 0.0, thought_turn: str = "first"):
    """An optimal episode (`lookup.demonstration` without hasty guesses) whose optional thought
    comes before call 0 (`first`, or an easy task with `decision`) or call 1 (a hard task with
    `decision`)."""
    if thought_turn not in THOUGHT_TURNS:
        raise ValueError(f"thought_turn must be one of {THOUGHT_TURNS}, got {thought_turn!r}")
    at = 1 if (thought_turn == "decision" and len(task.chain) > 1) else 0
    msgs, notes = task.messages(), dict(task.notes)
    for n, k in enumerate(task.chain):
        content = rng.choice(lk.PREAMBLES) if n == at else ""
        raw = lk.protocol.render_assistant(content, [("read_file", {"target_file": k})], n)
        msgs.append({"role": "assistant", "content": content, "raw": raw})
        msgs.append({"role": "tool", "tool_call_id": lk.protocol.call_id("read_file", n),
                     "content": notes[k]})
    raw = lk.protocol.render_assistant("", [("finish", {"message": task.code, "success": True})],
                                       len(task.chain))
    msgs.append({"role": "assistant", "content": "", "raw": raw})
    return msgs


def stated(task: lk.LookupTask) -> StatedLevelTask:
    """The same task with its level stated in the prompt."""
    return StatedLevelTask(**{f.name: getattr(task, f.name) for f in dataclasses.fields(task)})


@dataclasses.dataclass(frozen=True)
class LookupLevelsTaskConfig(LookupTaskConfig):
    """The lookup section (`LookupTaskConfig`) with the rl_async lookup run's sizes and both
    levels by default."""
    family: str = __name__
    num_train_tasks: int = 256
    num_eval_tasks: int = 256
    levels: tuple[str, ...] = ("easy", "hard")
    sft_steps: int = 500
    sft_hasty: float = 0.0
    thought_turn: str = "first"

    def __post_init__(self):
        super().__post_init__()
        if self.thought_turn not in THOUGHT_TURNS:
            from composer_jax.errors import ConfigError
            raise ConfigError(f"rl.task.thought_turn must be one of {THOUGHT_TURNS}, got "
                              f"{self.thought_turn!r}")


@register
class LookupLevelsFamily(LookupFamily):
    name = __name__
    config_cls = LookupLevelsTaskConfig

    def __init__(self, cfg):
        super().__init__(cfg)
        self._split = {s: [stated(t) for t in ts] for s, ts in self._split.items()}
        self._tasks = {x.task_id: x for split in self._split.values() for x in split}

    def initial_model(self):
        from composer_jax.rl.tasks.lookup_sft import initial_model
        t = self.task_cfg
        tasks = [stated(x) for x in lk.make_tasks(t.num_train_tasks, t.sft_seed, "train",
                                                  tuple(t.levels))]
        if t.thought_turn == "first":
            return initial_model(self.cfg, tasks, salt="stated-level")
        from composer_jax.rl.tasks.lookup_sft import sft_policy
        return initial_model(self.cfg, tasks, salt=f"stated-level-{t.thought_turn}",
                             train=lambda cfg, tasks, steps: sft_policy(
                                 cfg, tasks, steps, demo=functools.partial(
                                     demonstration, thought_turn=t.thought_turn)))
