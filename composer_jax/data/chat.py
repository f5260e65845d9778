"""Conversations -> token ids plus a per-token trainable mask, in the policy's chat template.

There is one chat template: the environment's (`composer_jax.env.protocol`, Kimi-K2 style), the
text an RL policy is prompted with and generates. SFT samples are rendered with it so the policy is
trained on exactly the text it will later produce. A conversation is encoded as

    BOS  [tool declarations]  turn  turn  ...        (no EOS: a conversation ends at <|im_end|>)

where each turn is `protocol.render_prompt([message])`. An assistant turn splits into its header
`<|im_assistant|>assistant<|im_middle|>` (given to the policy as the generation prompt, so not
trained) and its body: content, the tool-call section, and the closing `<|im_end|>` (the model must
learn to end its turn) -- the body is exactly what the policy generates, and it is the only trained
text. System, user and tool-result turns, tool declarations and BOS are never trained, nor is an
assistant turn whose message says `"trained": False` (a demonstrated mistake the next turns recover from).

Each piece is encoded on its own; pieces meet at special tokens, which the tokenizer matches
atomically, so the ids equal those of encoding the whole text at once and the mask aligns exactly.
`encode_prompt` is the matching encoder of a policy's prompt (the same BOS and template).

With `mark_values`, the trainable code of a trained token that begins a tool call's string argument
value (the token holding the value's first character) is `VALUE_START` (2) instead of 1. These
few tokens decide what a call does (which file, which text is replaced by which); the input
pipeline can weigh their loss (`data.sft_value_weight`, `data.targets`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from composer_jax.data import special_tokens as st
from composer_jax.data.targets import VALUE_START
from composer_jax.env import protocol

ASSISTANT_HEADER = protocol.render_prompt([], add_generation_prompt=True)
TRAINED = 1     # trainable codes: 0 = not trained, TRAINED, or VALUE_START (data.targets)


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
        pieces += [(ASSISTANT_HEADER, False), (text[len(ASSISTANT_HEADER):], bool(message.get("trained", True)))]
    rendered = "".join(text for text, _ in pieces[1:])
    if rendered != protocol.render_prompt(list(messages), list(tools), add_generation_prompt=False):
        raise ValueError("rendering turn by turn differs from protocol.render_prompt; the chat template "
                         "changed in a way composer_jax.data.chat does not handle")
    return pieces


def argument_value_starts(text: str) -> list[int]:
    """Character offsets in `text` (an assistant body) of the first character of each non-empty
    string argument value of its tool calls, in order. A call whose arguments are not the JSON
    object `protocol.render_tool_call` writes (as re-serialised) contributes none."""
    starts: list[int] = []
    pos = 0
    while (begin := text.find(protocol.TOOL_CALL_ARG_BEGIN, pos)) >= 0:
        first = begin + len(protocol.TOOL_CALL_ARG_BEGIN)
        end = text.find(protocol.TOOL_CALL_END, first)
        if end < 0:
            break
        pos = end
        try:
            arguments = json.loads(text[first:end])
        except ValueError:
            continue
        if not isinstance(arguments, dict) or json.dumps(arguments, ensure_ascii=False) != text[first:end]:
            continue
        offset = first + 1                                   # past "{"
        for i, (key, value) in enumerate(arguments.items()):
            offset += (2 if i else 0) + len(json.dumps(key, ensure_ascii=False)) + 2   # ', ' '"key"' ': '
            if isinstance(value, str) and value:
                starts.append(offset + 1)                    # past the opening quote
            offset += len(json.dumps(value, ensure_ascii=False))
    return starts


def _value_start_codes(tokenizer, text: str) -> tuple[list[int], list[int]]:
    """(ids, codes) of a trained piece: TRAINED, or VALUE_START on each token that holds the first
    character of an argument value (`argument_value_starts`)."""
    ids, spans = tokenizer.encode_offsets(text)
    codes = [TRAINED] * len(ids)
    starts = argument_value_starts(text)
    for i, (lo, hi) in enumerate(spans):
        if any(lo <= p < hi for p in starts):
            codes[i] = VALUE_START
    return ids, codes


def encode_pieces(tokenizer, pieces: Sequence[tuple[str, bool]],
                  mark_values: bool = False) -> tuple[list[int], list[int]]:
    """`(ids, trainable)` of rendered pieces, equal lengths; trainable[i] = 1 on trained pieces
    (VALUE_START on the first token of each argument value there, with `mark_values`)."""
    ids: list[int] = []
    trainable: list[int] = []
    for text, is_trainable in pieces:
        if is_trainable and mark_values:
            piece, codes = _value_start_codes(tokenizer, text)
        else:
            piece = tokenizer.encode(text)
            codes = [int(is_trainable)] * len(piece)
        ids += piece
        trainable += codes
    return ids, trainable


def encode_messages(tokenizer, messages: Sequence[dict], tools: Sequence[dict] = (),
                    mark_values: bool = False) -> tuple[list[int], list[int]]:
    """`(ids, trainable)` of a whole conversation; trainable on assistant bodies only (module doc)."""
    return encode_pieces(tokenizer, render_messages(messages, tools), mark_values)


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
