"""The "long lookup" variant: chains of long notes that do not fit the context window, so the
policy must summarise its progress to finish (self-summarisation in a real run).

Like the lookup family (`agent.lookup`: read the note the prompt names, follow its pointers,
finish with the code), but every note carries `filler` words of noise after its first line, and a
chain has `hops` notes (easy: `hops[0]`, hard: `hops[1]`):

    user: "Note CG."
    CG = "see HD\\nmoss lamp ... reed"   HD = "see EF\\n..."   ...   XY = "code 7\\n..."

A hard chain is longer than the engine's context (`rl.seq_len`), so with self-summarisation off
the episode stops with "context_full"; with it on (`rl.summary_trigger_tokens`) the agent asks
for a summary when the context fills and restarts from system prompt + task + the summary: the
episode finishes only if the policy's summary carries what it needs next ("Next note HD." or
"Code 7."). The prompt key is the only way into the chain, so a summary that does not name the
next note sends the policy back to the start.

Pure logic (no JAX): tasks (held-out prompt keys as in `agent.lookup`), the scripted optimal agent
and summary writer (`Oracle`, whose episodes through the token agent are the short SFT's data),
the summary checker and the variant's tokenizer. The RL family: `rl/tasks/lookup_long.py`.
"""
from __future__ import annotations

import dataclasses
import functools
import random
import re

from composer_jax.agent import lookup as lk, summarize
from composer_jax.config.data import SplitPattern
from composer_jax.data import special_tokens as st
from composer_jax.data.tokenizer import train_tokenizer
from composer_jax.env import protocol

FILLER = ("moss", "lamp", "reed", "wool", "tide", "sand", "fern", "pine", "mist", "rust",
          "salt", "dune", "hill", "pond", "rope", "silk")
_POINTER = re.compile(r"^see ([A-J]{2})\n")
_CODE = re.compile(r"^code (\d|[A-J]{2})\n")
_NEXT = re.compile(r"Next note ([A-J]{2})\.")
_FOUND = re.compile(r"Code (\d|[A-J]{2})\.")


@dataclasses.dataclass(frozen=True)
class LongTask(lk.LookupTask):
    """A lookup task whose notes start with their pointer or code, then filler words."""

    @property
    def chain(self) -> list[str]:
        notes, out, k = dict(self.notes), [], self.key
        while True:
            out.append(k)
            m = _POINTER.search(notes[k])
            if m is None:
                return out
            k = m.group(1)


def make_tasks(n: int, seed: int = 0, split: str = "train", levels=("easy", "hard"),
               hops=(1, 4), filler: int = 12, letter_codes: bool = False) -> list[LongTask]:
    """n tasks of `split` (prompt keys from `lookup.keys_of(split)`), levels cycling, a chain of
    hops[level] notes with `filler` noise words each, and two distractor notes; codes are digits,
    or with `letter_codes` two letters like a key (never a note of the task); deterministic."""
    if len(hops) != 2 or min(hops) < 1:
        raise ValueError(f"hops must be two chain lengths >= 1 (easy, hard), got {hops!r}")
    keys = lk.keys_of(split)
    rng = random.Random(seed * 1_000_003 + (7_919 if split == "eval" else 0) + 17)
    out = []
    for i in range(n):
        level = levels[i % len(levels)]
        h = hops[lk.LEVELS.index(level)]
        key = keys[rng.randrange(len(keys))]
        chain = [key] + rng.sample([k for k in lk.all_keys() if k != key], h - 1 + 2)
        codes = (rng.sample([k for k in lk.all_keys() if k not in chain], 3) if letter_codes
                 else rng.sample("0123456789", 3))

        def noise():
            return " ".join(rng.choice(FILLER) for _ in range(filler))
        notes = {chain[j]: f"see {chain[j + 1]}\n{noise()}" for j in range(h - 1)}
        notes[chain[h - 1]] = f"code {codes[0]}\n{noise()}"
        notes[chain[h]] = f"code {codes[1]}\n{noise()}"          # distractors
        notes[chain[h + 1]] = f"code {codes[2]}\n{noise()}"
        out.append(LongTask(f"lookup_long-{split}-{level}-{i:05d}-{key}", key, level, codes[0],
                            tuple(sorted(notes.items()))))
    return out


def progress(task: LongTask, messages: list[dict]) -> tuple[str, str]:
    """What an optimal agent knows from a segment's conversation: ("read", key) of the next note,
    or ("finish", code). The newest tool result wins, then a summary, then the prompt key."""
    for m in reversed(messages):
        if m["role"] == "tool":
            if (p := _POINTER.search(m["content"])) is not None:
                return "read", p.group(1)
            if (c := _CODE.search(m["content"])) is not None:
                return "finish", c.group(1)
        if m["role"] == "user" and st.SUMMARY_BEGIN in m["content"]:
            text = m["content"]
            if (p := _NEXT.search(text)) is not None:
                return "read", p.group(1)
            if (c := _FOUND.search(text)) is not None:
                return "finish", c.group(1)
    return "read", task.key


def summary_text(step: tuple[str, str]) -> str:
    """The summary an optimal agent writes: "Next note XY." or "Code 7."."""
    kind, value = step
    return f"Next note {value}." if kind == "read" else f"Code {value}."


def summary_correct(task: LongTask, summary: str, messages: list[dict]) -> bool:
    """Whether a summary written after `messages` (the ended segment) carries the optimal next
    step exactly (`summary_text(progress(...))`)."""
    return summary.strip() == summary_text(progress(task, messages))


class Oracle:
    """The scripted optimal agent of one episode (`agent.token_agent.ScriptedPolicy`'s `agent`
    and `summary`): reads the next note, finishes with the code, summarises the next step."""

    def __init__(self, task: LongTask):
        self.task, self.calls = task, 0

    def __call__(self, messages: list[dict]) -> str:
        kind, value = progress(self.task, messages)
        call = (("read_file", {"target_file": value}) if kind == "read"
                else ("finish", {"message": value, "success": True}))
        self.calls += 1
        return protocol.render_assistant("", [call], self.calls - 1)

    def summary(self, messages: list[dict]) -> str:
        return summary_text(progress(self.task, messages))


def tokenizer_texts(seed: int = 0) -> list[str]:
    """Key-free texts for the variant's tokenizer: the lookup family's, the filler words, summary
    request / preamble and summaries (keys removed, as in `lookup.tokenizer_texts`)."""
    rng = random.Random(seed)
    texts = lk.tokenizer_texts(seed)
    for _ in range(200):
        text = protocol.render_prompt([
            summarize.request_message(),
            {"role": "assistant", "content": "", "raw": st.SUMMARY_BEGIN + summary_text(
                ("read" if rng.random() < 0.7 else "finish", str(rng.randrange(10))))
             + st.SUMMARY_END},
            summarize.summary_message(summary_text(("read", ""))),
            {"role": "tool", "tool_call_id": "functions.read_file:1",
             "content": "see \n" + " ".join(rng.choice(FILLER) for _ in range(16))}],
            add_generation_prompt=False)
        texts.append(re.sub(f"[{lk.LETTERS}]{{2}}", "", text))
    return texts


@functools.lru_cache(maxsize=2)
def long_tokenizer(vocab_size: int = lk.VOCAB_SIZE):
    """A byte-level BPE (`data.tokenizer.train_tokenizer`) on `tokenizer_texts`; deterministic."""
    return train_tokenizer(tokenizer_texts(0), vocab_size, SplitPattern.KIMI)
