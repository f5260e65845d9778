"""The "parity" tasks: a task family with a known optimum (no JAX).

Each task asks for a reply whose characters all have a given parity of their code point:

    system: "Reply with characters of the requested parity."
    user:   "even"                              -> reward = fraction of the reply's characters c
                                                    with ord(c) % 2 == 0
The reply is the final message of the protocol (`env.protocol.parse_assistant(text).content`), so
a reply that opens a tool-call section or is empty scores 0. Known optimum: reward 1.0; a uniform
random policy scores about 0.5. The RL family is `composer_jax.rl.tasks.parity`; the engine-based
helpers (train_toy, run_group) are in `composer_jax.rl.toy_tasks`.
"""
from __future__ import annotations

import dataclasses
import random
from typing import Sequence

from composer_jax.data.chat import encode_prompt
from composer_jax.data.config import SplitPattern
from composer_jax.data.tokenizer import train_tokenizer
from composer_jax.env import protocol

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
    texts = [protocol.render_prompt(t.messages()) for t in make_tasks(200, 0)]
    texts += ["abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789"] * 4
    return train_tokenizer(texts, vocab_size, SplitPattern.KIMI)


def prompt_ids(tokenizer, task: ToyTask) -> list[int]:
    """BOS + the chat template of the task + the assistant generation prompt."""
    return encode_prompt(tokenizer, task.messages())
