"""Conversations -> token ids plus a per-token trainable mask, in the policy's chat template.

There is one chat template: the environment's (`composer_jax.env.protocol`, Kimi-K2 style), the
text an RL policy is prompted with and generates. SFT samples are rendered with it so the policy is
trained on exactly the text it will later produce. A conversation is encoded as

    BOS  [tool declarations]  turn  turn  ...        (no EOS: a conversation ends at <|im_end|>)

where each turn is `protocol.render_prompt([message])`. An assistant turn splits into its header
`<|im_assistant|>assistant<|im_middle|>` (given to the policy as the generation prompt, so not
trained) and its body: content, the tool-call section, and the closing `<|im_end|>` (the model must
learn to end its turn) -- the body is exactly what the policy generates, and it is the only trained
text. System, user and tool-result turns, tool declarations and BOS are never trained.

Each piece is encoded on its own; pieces meet at special tokens, which the tokenizer matches
atomically, so the ids equal those of encoding the whole text at once and the mask aligns exactly.
`encode_prompt` is the matching encoder of a policy's prompt (the same BOS and template).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from composer_jax.data import special_tokens as st
from composer_jax.env import protocol

ASSISTANT_HEADER = protocol.render_prompt([], add_generation_prompt=True)


def render_messages(messages: Sequence[dict], tools: Sequence[dict] = ()) -> list[tuple[str, bool]]:
    """`[(text, trainable)]` pieces of a conversation (see the module doc); messages are protocol
    dicts `{"role", "content", "tool_calls"?, "tool_call_id"?}`, `tools` JSON tool specs."""
    pieces: list[tuple[str, bool]] = [(st.BOS, False)]
    if tools:
        pieces.append((protocol.render_prompt([], list(tools), add_generation_prompt=False), False))
    for message in messages:
        text = protocol.render_prompt([dict(message)], add_generation_prompt=False)
        if message["role"] != "assistant":
            pieces.append((text, False))
            continue
        if not text.startswith(ASSISTANT_HEADER):
            raise ValueError(f"assistant turn does not start with the generation prompt {ASSISTANT_HEADER!r}")
        pieces += [(ASSISTANT_HEADER, False), (text[len(ASSISTANT_HEADER):], True)]
    rendered = "".join(text for text, _ in pieces[1:])
    if rendered != protocol.render_prompt(list(messages), list(tools), add_generation_prompt=False):
        raise ValueError("rendering turn by turn differs from protocol.render_prompt; the chat template "
                         "changed in a way composer_jax.data.chat does not handle")
    return pieces


def encode_pieces(tokenizer, pieces: Sequence[tuple[str, bool]]) -> tuple[list[int], list[int]]:
    """`(ids, trainable)` of rendered pieces, equal lengths; trainable[i] = 1 on trained pieces."""
    ids: list[int] = []
    trainable: list[int] = []
    for text, is_trainable in pieces:
        piece = tokenizer.encode(text)
        ids += piece
        trainable += [int(is_trainable)] * len(piece)
    return ids, trainable


def encode_messages(tokenizer, messages: Sequence[dict], tools: Sequence[dict] = ()) -> tuple[list[int], list[int]]:
    """`(ids, trainable)` of a whole conversation; trainable on assistant bodies only (module doc)."""
    return encode_pieces(tokenizer, render_messages(messages, tools))


def encode_prompt(tokenizer, messages: Sequence[dict], tools: Sequence[dict] = ()) -> list[int]:
    """Ids of a policy's prompt: BOS + the conversation so far + the assistant generation prompt,
    i.e. the untrained prefix that `encode_messages` gives the next assistant turn."""
    return tokenizer.encode(st.BOS + protocol.render_prompt(list(messages), list(tools), add_generation_prompt=True))


_PROBE = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
          {"role": "assistant", "content": "a", "tool_calls": [
              {"call_id": protocol.call_id("f", 0), "name": "f", "arguments": {"x": 1}, "raw": "", "error": None}]},
          {"role": "tool", "tool_call_id": protocol.call_id("f", 0), "content": "r"}]


def template_fingerprint() -> str:
    """A short hash of how the template renders a probe conversation (cache keys of rendered samples:
    they are rebuilt when the template or the protocol's system prompt changes)."""
    pieces = render_messages(_PROBE, [{"name": "f"}])
    text = repr(pieces) + protocol.SYSTEM_PROMPT
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
