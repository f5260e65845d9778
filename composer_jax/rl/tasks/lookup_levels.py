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

`rl.task.verify=P` (> 0; default 0 = off): a length that pays on hard tasks only. A hard task's
last note shows a stale draft code on its FIRST read (`DraftBook`: a draft of `VerifyTask.draft`)
and the real code on any later read; an easy note reads the same every time. Each demonstration
(`verify_demonstration`, no thought) re-reads its last note before finishing with probability P on
both levels, and finishes with the last code it saw: so the initial policy verifies as often on
both levels, and a hard episode that skips the re-read reports the draft (wrong). On easy tasks
the re-read is pure cost (one more call, turn and ~15 tokens under the length term); on hard
tasks it is what makes the episode correct. `rl.task.max_turns=4` fits a verified hard episode;
its demonstration is ~200 tokens, so set `rl.seq_len=256`.

`rl.task.draft_shown=marked` (with verify; default `plain`): the draft read says so, `code D
(draft)`, so the cue to verify is in the observation right before the decision instead of only in
the prompt's level several turns back. A hard task's later reads and every easy read are plain
`code C`, and the demonstrations still re-read with probability P whatever they saw: the initial
policy verifies as often after a plain read as after a draft, and only RL can tie the re-read to
the cue (benchmarks/results/rl_length.txt, runs M*).
"""
from __future__ import annotations

import dataclasses
import functools
import zlib

from composer_jax.agent import lookup as lk
from composer_jax.config.rl import LookupTaskConfig
from composer_jax.errors import ConfigError
from composer_jax.rl.tasks.lookup import LookupFamily
from composer_jax.rl.tasks.registry import register


@dataclasses.dataclass(frozen=True)
class StatedLevelTask(lk.LookupTask):
    """A lookup task whose user message states its level."""

    def messages(self) -> list[dict]:
        return [{"role": "system", "content": lk.SYSTEM},
                {"role": "user", "content": f"Level {self.level}. Note {self.key}."}]


THOUGHT_TURNS = ("first", "decision")
DRAFT_SHOWN = ("plain", "marked")


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
class VerifyTask(StatedLevelTask):
    """A stated-level task whose last note reads `code <draft>` the first time (draft: a digit
    other than the code on hard tasks, "" = no draft on easy ones; `code <draft> (draft)` when
    `marked`)."""
    draft: str = ""
    marked: bool = False


def with_draft(task: lk.LookupTask, shown: str = "plain") -> VerifyTask:
    """The stated-level task with a draft on hard tasks: a digit != code and != every other note's
    code, drawn deterministically from the task id; `shown="marked"` labels its read a draft."""
    if shown not in DRAFT_SHOWN:
        raise ValueError(f"draft_shown must be one of {DRAFT_SHOWN}, got {shown!r}")
    if task.level != "hard":
        return VerifyTask(**{f.name: getattr(task, f.name) for f in dataclasses.fields(task)})
    used = {t[5:] for _, t in task.notes if t.startswith("code ")}
    free = sorted(set("0123456789") - used)
    draft = free[zlib.crc32(task.task_id.encode()) % len(free)]
    return VerifyTask(**{f.name: getattr(task, f.name) for f in dataclasses.fields(task)},
                      draft=draft, marked=shown == "marked")


class DraftBook(lk.NoteBook):
    """`NoteBook` whose first read of a VerifyTask's last note returns `code <draft>` (when the
    task has a draft); later reads return the note."""

    def __init__(self, task: VerifyTask):
        super().__init__(task)
        self.draft, self.last = task.draft, task.chain[-1]
        self.label = " (draft)" if task.marked else ""

    def call(self, name: str, arguments) -> lk.ToolResult:
        r = super().call(name, arguments)
        if (self.draft and name == "read_file" and not r.is_error and self.reads
                and self.reads[-1] == self.last and self.reads.count(self.last) == 1):
            return lk.ToolResult(f"code {self.draft}{self.label}")
        return r


def verify_demonstration(task: VerifyTask, rng, hasty: float = 0.0, verify: float = 0.5):
    """An episode that reads the chain, re-reads the last note with probability `verify` (both
    levels), then finishes with the last code it saw (the draft on a hard task it did not
    verify: wrong)."""
    book, msgs, index = DraftBook(task), task.messages(), 0
    reads = list(task.chain) + ([task.chain[-1]] if rng.random() >= 1 - verify else [])
    for k in reads:
        raw = lk.protocol.render_assistant("", [("read_file", {"target_file": k})], index)
        msgs.append({"role": "assistant", "content": "", "raw": raw})
        seen = book.call("read_file", {"target_file": k}).output
        msgs.append({"role": "tool", "tool_call_id": lk.protocol.call_id("read_file", index),
                     "content": seen})
        index += 1
    raw = lk.protocol.render_assistant("", [("finish", {"message": seen.split()[1],
                                                        "success": True})],
                                       index)
    msgs.append({"role": "assistant", "content": "", "raw": raw})
    return msgs


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
    verify: float = 0.0
    draft_shown: str = "plain"

    def __post_init__(self):
        super().__post_init__()
        if not 0.0 <= self.verify < 1.0:
            raise ConfigError(f"rl.task.verify must be in [0, 1) (the demonstrations' re-read "
                              f"probability; 0 = off), got {self.verify}")
        if self.draft_shown not in DRAFT_SHOWN:
            raise ConfigError(f"rl.task.draft_shown must be one of {DRAFT_SHOWN}, got "
                              f"{self.draft_shown!r}")
        if self.draft_shown != "plain" and self.verify == 0:
            raise ConfigError("rl.task.draft_shown=marked labels the draft of rl.task.verify: "
                              "set rl.task.verify=P (> 0) too")
        if self.thought_turn not in THOUGHT_TURNS:
            raise ConfigError(f"rl.task.thought_turn must be one of {THOUGHT_TURNS}, got "
                              f"{self.thought_turn!r}")


@register
class LookupLevelsFamily(LookupFamily):
    name = __name__
    config_cls = LookupLevelsTaskConfig

    def __init__(self, cfg):
        super().__init__(cfg)
        shown = self.task_cfg.draft_shown
        wrap = (functools.partial(with_draft, shown=shown) if self.task_cfg.verify > 0
                else stated)
        self._split = {s: [wrap(t) for t in ts] for s, ts in self._split.items()}
        self._tasks = {x.task_id: x for split in self._split.values() for x in split}

    def notebook(self, task):
        return DraftBook(task) if isinstance(task, VerifyTask) else lk.NoteBook(task)

    def initial_model(self):
        # JAX: the SFT policy is built on the trainer and inference side, not in rollout workers
        from composer_jax.rl.tasks.lookup_sft import initial_model, sft_policy
        t = self.task_cfg
        if t.verify > 0:
            tasks = [with_draft(x, t.draft_shown)
                     for x in lk.make_tasks(t.num_train_tasks, t.sft_seed, "train", tuple(t.levels))]
            salt = f"stated-level-verify-{t.verify}" + ("" if t.draft_shown == "plain"
                                                        else f"-{t.draft_shown}")
            return initial_model(self.cfg, tasks, salt=salt,
                                 train=lambda cfg, tasks, steps: sft_policy(
                                     cfg, tasks, steps, demo=functools.partial(
                                         verify_demonstration, verify=t.verify)))
        tasks = [stated(x) for x in lk.make_tasks(t.num_train_tasks, t.sft_seed, "train",
                                                  tuple(t.levels))]
        if t.thought_turn == "first":
            return initial_model(self.cfg, tasks, salt="stated-level")
        return initial_model(self.cfg, tasks, salt=f"stated-level-{t.thought_turn}",
                             train=lambda cfg, tasks, steps: sft_policy(
                                 cfg, tasks, steps, demo=functools.partial(
                                     demonstration, thought_turn=t.thought_turn)))
