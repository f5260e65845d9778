"""Self-summarization mechanics for a token-level agent (no JAX).

When an episode's context would pass `rl.summary_trigger_tokens`, the agent ends the current
segment with a summary turn: it feeds the pending tool results plus a user message asking for a
summary, then the generation prompt and `<|summary_begin|>`; the policy writes the summary and
closes it with `<|summary_end|>`. The next segment restarts from system prompt + task + one user
message holding the summary between the markers (plus any tool results that did not fit before
the summary). Each segment is one training sample sharing the episode's final reward.

The markers are the reserved special tokens `SUMMARY_BEGIN` / `SUMMARY_END` of
`composer_jax.data.special_tokens`, so each is one atomic id.
"""
from __future__ import annotations

from composer_jax.data import special_tokens as st

SUMMARY_REQUEST = (
    "Your context is almost full. Write a concise summary of your progress so far: the task, what "
    "you found (files, functions, causes), what you changed, what remains to do, and the next "
    "step. The conversation will restart from the task and this summary only.")

SUMMARY_PREAMBLE = "Summary of your earlier work on this task (the context was reset):\n"


def should_summarize(context_tokens: int, feed_tokens: int, max_new_tokens: int,
                     trigger_tokens: int) -> bool:
    """True when feeding `feed_tokens` and generating a full turn would pass the trigger
    (trigger 0 = self-summarization off)."""
    return trigger_tokens > 0 and context_tokens + feed_tokens + max_new_tokens > trigger_tokens


def request_message() -> dict:
    """The user message that asks for a summary."""
    return {"role": "user", "content": SUMMARY_REQUEST}


def summary_message(summary: str) -> dict:
    """The user message that carries a summary into the next segment."""
    return {"role": "user", "content": f"{SUMMARY_PREAMBLE}{st.SUMMARY_BEGIN}{summary}{st.SUMMARY_END}"}


def extract_summary(text: str) -> str:
    """The summary text from a summary turn's generated text (markers and whitespace removed)."""
    text = text.split(st.SUMMARY_END, 1)[0]
    return text.replace(st.SUMMARY_BEGIN, "").strip()


def restart_messages(initial: list[dict], summary: str) -> list[dict]:
    """The conversation a new segment starts from: system prompt + task + the summary."""
    return list(initial) + [summary_message(summary)]
