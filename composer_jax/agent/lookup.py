"""The "lookup" task family: read a note named in the prompt with tools, follow it, report its code.

A known-optimum, multi-turn, tool-using family that a tiny policy learns on a CPU (the default task
family of `rl_async`). Each task holds a few in-memory notes; the user names one:

    system: "Read the note the user names with read_file. Each note holds a code or points to
             another note. Then call finish with the code and success."
    user:   "Note CG."
    easy  (level 0): note CG = "code 7"                         -> read_file(CG), finish("7")
    hard  (level 1): note CG = "see HD", note HD = "code 7"     -> read_file(CG), read_file(HD),
                                                                   finish("7")
    distractors: two other notes with other codes (reading them gives a wrong code)

Tools: the repository's own `read_file(target_file)` and `finish(message, success)` interfaces
(`env/tools/schema.py`: the same names, argument schemas and validation), served in-process over
the task's notes (`NoteBook`): a sandbox adds nothing to a dictionary lookup. The episode goes
through the real tool protocol (`env/protocol.py`: tool-call sections parsed from the sampled
text, `## Return of functions.read_file:0` results fed back as tokens).

Known optimum: correct = the finish message is exactly the task's code (reward 1 + the
communication bonus, minus the length penalty of a minimal episode); the correct action depends on
the prompt (which note to read) and on what the tools return (the code, or the next note).

Held-out split, disjoint by construction: keys are ordered pairs of distinct letters of `LETTERS`;
a key is held-out iff (3 i + j) % 5 == 0 (i, j its letters' indices), so every letter occurs in
both splits but no prompt key does (`split_of`); tests check the rendered prompt token sequences.

Pure logic only (no JAX): task generation, rendering, the notebook tools, demonstrations (for the
short SFT that teaches the protocol), grading and the family's tokenizer. The RL task family
(`rl.task=lookup`: episodes through the token-level agent's loop, the SFT initial policy):
`composer_jax/rl/tasks/lookup.py`.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import random
import re
from typing import Sequence

from composer_jax.config.data import SplitPattern
from composer_jax.data.tokenizer import train_tokenizer
from composer_jax.env import protocol
from composer_jax.env.tools.result import ToolResult, error
from composer_jax.env.tools.schema import validate_arguments

VOCAB_SIZE = 448
LETTERS = "ABCDEFGHIJ"
SYSTEM = ("Read the note the user names with read_file. Each note holds a code or points to another "
          "note. Then call finish with the code and success.")
LEVELS = ("easy", "hard")
TOOL_NAMES = ("read_file", "finish")
PREAMBLES = ("", "Let me read it.", "Let me read the note first and then report the code.")
_SPLIT_SALT = {"train": 0, "eval": 7_919}


def all_keys() -> list[str]:
    return [a + b for a in LETTERS for b in LETTERS if a != b]


def split_of(key: str) -> str:
    """"eval" (held-out) iff (3 i + j) % 5 == 0 for the key's letter indices i, j; else "train"."""
    i, j = LETTERS.index(key[0]), LETTERS.index(key[1])
    return "eval" if (3 * i + j) % 5 == 0 else "train"


def keys_of(split: str) -> list[str]:
    if split not in _SPLIT_SALT:
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    return [k for k in all_keys() if split_of(k) == split]


@dataclasses.dataclass(frozen=True)
class LookupTask:
    """One task: the prompt key, its level, the answer code and every note (name -> text)."""
    task_id: str
    key: str
    level: str          # "easy" | "hard"
    code: str           # one digit
    notes: tuple        # ((name, text), ...)

    def messages(self) -> list[dict]:
        return [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Note {self.key}."}]

    @property
    def chain(self) -> list[str]:
        """The notes an optimal episode reads, in order."""
        notes, out, k = dict(self.notes), [], self.key
        while True:
            out.append(k)
            text = notes[k]
            if not text.startswith("see "):
                return out
            k = text[4:]


def make_tasks(n: int, seed: int = 0, split: str = "train",
               levels: Sequence[str] = ("easy",)) -> list[LookupTask]:
    """n tasks of `split` (keys from `keys_of(split)` only), levels cycling through `levels`;
    deterministic in (n, seed, split, levels). Codes, pointers and distractor names are drawn from
    the seeded generator (distractors and pointer targets may use any key: they never appear in
    the prompt)."""
    if not levels or any(lv not in LEVELS for lv in levels):
        raise ValueError(f"levels must be a non-empty subset of {LEVELS}, got {levels!r}")
    keys = keys_of(split)
    rng = random.Random(seed * 1_000_003 + _SPLIT_SALT[split])
    out = []
    for i in range(n):
        level = levels[i % len(levels)]
        key = keys[rng.randrange(len(keys))]
        others = rng.sample([k for k in all_keys() if k != key], 3)
        codes = rng.sample("0123456789", 4)
        notes = {others[1]: f"code {codes[1]}", others[2]: f"code {codes[2]}"}
        if level == "easy":
            notes[key] = f"code {codes[0]}"
            notes[others[0]] = f"code {codes[3]}"
        else:
            notes[key] = f"see {others[0]}"
            notes[others[0]] = f"code {codes[0]}"
        out.append(LookupTask(f"lookup-{split}-{level}-{i:05d}-{key}", key, level, codes[0],
                              tuple(sorted(notes.items()))))
    return out


class NoteBook:
    """The in-process tools of one episode over a task's notes, with the workspace's counters
    (`num_calls`, `num_invalid_calls`, `reads`). Arguments are validated by the repository's tool
    schemas (`env.tools.schema.validate_arguments`); a tool other than read_file/finish is an
    invalid call."""

    def __init__(self, task: LookupTask):
        self.notes = dict(task.notes)
        self.num_calls = self.num_invalid_calls = 0
        self.reads: list[str] = []
        self.finish_args: dict | None = None

    def call(self, name: str, arguments) -> ToolResult:
        self.num_calls += 1
        problem = (f"unknown tool {name!r}; available tools: read_file, finish"
                   if name not in TOOL_NAMES else validate_arguments(name, arguments))
        if problem is None and name == "read_file":
            target = arguments["target_file"]
            if target not in self.notes:
                problem = f"file not found: {target}"
            else:
                self.reads.append(target)
                return ToolResult(self.notes[target])
        if problem is not None:
            self.num_invalid_calls += 1
            return error(problem)
        self.finish_args = dict(arguments)
        return ToolResult(arguments["message"], finished=True)

    def checkpoint_state(self) -> dict:
        """The counters and reads (an episode checkpoint; the notes come from the task)."""
        return {"num_calls": self.num_calls, "num_invalid_calls": self.num_invalid_calls,
                "reads": list(self.reads), "finish_args": self.finish_args}

    def restore_state(self, state: dict) -> None:
        self.num_calls, self.num_invalid_calls = state["num_calls"], state["num_invalid_calls"]
        self.reads, self.finish_args = list(state["reads"]), state["finish_args"]

    def execute(self, call: protocol.ToolCall) -> ToolResult:
        """A parsed call; a malformed one (`call.error`) counts as an invalid call."""
        if call.error is not None:
            self.num_calls += 1
            self.num_invalid_calls += 1
            return error(call.error)
        return self.call(call.name, call.arguments)


def demonstration(task: LookupTask, rng: random.Random, hasty: float = 0.0) -> list[dict]:
    """A demonstration conversation (for the short SFT that teaches the protocol). With
    probability `hasty` a hasty agent: finish(a random code, success=true) at once, without
    reading (one tool call; right only by chance, and then a false claim). Otherwise an optimal
    episode: a random preamble (none or one of `PREAMBLES`) before the first call, one read_file
    per note of the chain, then finish(code, success=true)."""
    msgs = task.messages()
    if rng.random() < hasty:
        guess = str(rng.randrange(10))
        raw = protocol.render_assistant(rng.choice(PREAMBLES),
                                        [("finish", {"message": guess, "success": True})], 0)
        msgs.append({"role": "assistant", "content": "", "raw": raw})
        return msgs
    index = 0
    for n, k in enumerate(task.chain):
        content = rng.choice(PREAMBLES) if n == 0 else ""
        raw = protocol.render_assistant(content, [("read_file", {"target_file": k})], index)
        msgs.append({"role": "assistant", "content": content, "raw": raw})
        msgs.append({"role": "tool", "tool_call_id": protocol.call_id("read_file", index),
                     "content": dict(task.notes)[k]})
        index += 1
    raw = protocol.render_assistant("", [("finish", {"message": task.code, "success": True})],
                                    index)
    msgs.append({"role": "assistant", "content": "", "raw": raw})
    return msgs


@dataclasses.dataclass(frozen=True)
class Grade:
    """correct: finish was called with exactly the code; claimed: finish's `success` argument
    (False without a finish call); message: the finish message ("" without one)."""
    correct: bool
    claimed: bool
    message: str
    finished: bool


def grade(task: LookupTask, book: NoteBook) -> Grade:
    """The rule: correct iff the episode ended with finish(message == code). The claim is the
    structured `success` argument of that call, never read from the prose."""
    if book.finish_args is None:
        return Grade(False, False, "", False)
    msg = str(book.finish_args.get("message", ""))
    return Grade(msg.strip() == task.code, bool(book.finish_args.get("success", False)), msg, True)


def tokenizer_texts(seed: int = 0) -> list[str]:
    """Texts to train the family's tokenizer on: demonstrations of the training split with every
    key removed, so no merge contains a key letter: a key is the same two one-letter tokens in
    both splits (`tests/rl/test_lookup_tasks.py` checks it), and a held-out key is a new
    combination of known tokens, not a new token."""
    rng = random.Random(seed)
    texts = []
    for t in make_tasks(200, seed, "train", LEVELS):
        text = protocol.render_prompt(demonstration(t, rng), add_generation_prompt=False)
        texts.append(re.sub(f"[{LETTERS}]{{2}}", "", text))
    texts.append(json.dumps({"message": "", "success": False}))
    return texts


@functools.lru_cache(maxsize=2)
def lookup_tokenizer(vocab_size: int = VOCAB_SIZE):
    """A byte-level BPE (the project's `train_tokenizer`) on key-free demonstrations; deterministic."""
    return train_tokenizer(tokenizer_texts(0), vocab_size, SplitPattern.KIMI)
