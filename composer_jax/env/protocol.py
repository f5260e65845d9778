"""The chat template (Kimi-K2 style), its special tokens, and the parser from model text to tool calls.

Rendered conversation (every special token below is one reserved token for the tokenizer):

  <|im_system|>tool_declare<|im_middle|>[...JSON tool specs...]<|im_end|>
  <|im_system|>system<|im_middle|>You are ...<|im_end|>
  <|im_user|>user<|im_middle|>Fix the failing test ...<|im_end|>
  <|im_assistant|>assistant<|im_middle|>Let me look.<|tool_calls_section_begin|>
      <|tool_call_begin|>functions.read_file:0<|tool_call_argument_begin|>{"target_file": "a.py"}
      <|tool_call_end|><|tool_calls_section_end|><|im_end|>
  <|im_system|>tool<|im_middle|>## Return of functions.read_file:0
  ...file text...<|im_end|>
  <|im_assistant|>assistant<|im_middle|>            <- generation prompt

(no newlines between the tokens of a call; they are shown wrapped here). A tool call id is
`functions.{name}:{index}` with a running index over the episode. Messages are plain dicts:
{"role": "system"|"user"|"assistant"|"tool", "content": str, "tool_calls": [ToolCall as dict],
"tool_call_id": str}. `parse_assistant` never raises: garbled or truncated calls come back as
`ToolCall`s with `error` set, which the episode answers with an error result.

Exact, incremental rendering (token-level agents): an assistant message may carry `raw`, the exact
text the policy generated (before its closing <|im_end|>); it is then rendered verbatim instead of
re-serialising the parsed calls (whose JSON spacing may differ from what was sampled). With raw
assistant texts, the whole conversation renders as the concatenation of per-turn pieces:

  render_prompt(M0 + [A1] + T1 + [A2] + T2 ..., tools)
      == render_prompt(M0, tools) + A1.raw + IM_END + render_continuation(T1) + A2.raw + IM_END ...

(`render_prompt` and `render_continuation` end with the generation prompt; the last piece is
rendered with add_generation_prompt=False when the conversation ends on an assistant turn), so an
agent can encode only the new text of each turn and feed it to a cached session.
"""
from __future__ import annotations

import dataclasses
import json
import re

IM_SYSTEM = "<|im_system|>"
IM_USER = "<|im_user|>"
IM_ASSISTANT = "<|im_assistant|>"
IM_MIDDLE = "<|im_middle|>"
IM_END = "<|im_end|>"
TOOL_CALLS_BEGIN = "<|tool_calls_section_begin|>"
TOOL_CALLS_END = "<|tool_calls_section_end|>"
TOOL_CALL_BEGIN = "<|tool_call_begin|>"
TOOL_CALL_ARG_BEGIN = "<|tool_call_argument_begin|>"
TOOL_CALL_END = "<|tool_call_end|>"

SPECIAL_TOKENS: tuple[str, ...] = (IM_SYSTEM, IM_USER, IM_ASSISTANT, IM_MIDDLE, IM_END,
                                   TOOL_CALLS_BEGIN, TOOL_CALLS_END, TOOL_CALL_BEGIN,
                                   TOOL_CALL_ARG_BEGIN, TOOL_CALL_END)
ASSISTANT_PROMPT = IM_ASSISTANT + "assistant" + IM_MIDDLE     # the generation prompt
_ROLE_TOKEN = {"system": IM_SYSTEM, "tool": IM_SYSTEM, "tool_declare": IM_SYSTEM,
               "user": IM_USER, "assistant": IM_ASSISTANT}

SYSTEM_PROMPT = (
    "You are a coding assistant working in a repository at /workspace. Use the tools to inspect "
    "and edit files and to run commands; there is no network. Keep changes minimal and focused on "
    "the request, do not edit the tests, check your work by running them, and call `finish` with "
    "a short summary when you are done.")


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One parsed call. `arguments` is None and `error` says why when the call is malformed."""
    call_id: str
    name: str
    arguments: dict | None
    raw: str
    error: str | None = None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ParsedTurn:
    """An assistant turn: free text plus the tool calls in its tool-call section."""
    content: str
    tool_calls: tuple[ToolCall, ...]


def call_id(name: str, index: int) -> str:
    return f"functions.{name}:{index}"


def render_tool_call(name: str, arguments: dict, index: int) -> str:
    """The exact text of one tool call (what a model should generate)."""
    return (TOOL_CALL_BEGIN + call_id(name, index) + TOOL_CALL_ARG_BEGIN
            + json.dumps(arguments, ensure_ascii=False) + TOOL_CALL_END)


def render_assistant(content: str, calls: list[tuple[str, dict]], first_index: int = 0) -> str:
    """Assistant text (without role header or <|im_end|>): content then the tool-call section."""
    if not calls:
        return content
    body = "".join(render_tool_call(n, a, first_index + i) for i, (n, a) in enumerate(calls))
    return content + TOOL_CALLS_BEGIN + body + TOOL_CALLS_END


def _render_message(m: dict) -> str:
    role = m["role"]
    if role not in _ROLE_TOKEN:
        raise ValueError(f"unknown role {role!r}; valid roles: {sorted(_ROLE_TOKEN)}")
    content = m.get("content") or ""
    if role == "tool":
        content = f"## Return of {m.get('tool_call_id', 'functions.unknown:0')}\n{content}"
    if role == "assistant" and m.get("raw") is not None:
        content = m["raw"]
    elif role == "assistant" and m.get("tool_calls"):
        calls = m["tool_calls"]
        body = "".join(c["raw"] if c.get("error") else (
            TOOL_CALL_BEGIN + c["call_id"] + TOOL_CALL_ARG_BEGIN
            + json.dumps(c["arguments"], ensure_ascii=False) + TOOL_CALL_END) for c in calls)
        content = content + TOOL_CALLS_BEGIN + body + TOOL_CALLS_END
    return f"{_ROLE_TOKEN[role]}{role}{IM_MIDDLE}{content}{IM_END}"


def render_prompt(messages: list[dict], tools: tuple[dict, ...] | list[dict] = (),
                  add_generation_prompt: bool = True) -> str:
    """The whole conversation as model text (tool declarations first if any)."""
    parts = []
    if tools:
        parts.append(f"{IM_SYSTEM}tool_declare{IM_MIDDLE}"
                     f"{json.dumps(list(tools), ensure_ascii=False)}{IM_END}")
    parts += [_render_message(m) for m in messages]
    if add_generation_prompt:
        parts.append(f"{IM_ASSISTANT}assistant{IM_MIDDLE}")
    return "".join(parts)


def render_continuation(messages: list[dict], add_generation_prompt: bool = True) -> str:
    """The text that follows an assistant turn closed by <|im_end|>: the new messages (tool
    results, a user message) and the generation prompt (see the module docstring)."""
    return render_prompt(list(messages), (), add_generation_prompt)


def assistant_message(raw: str, turn: ParsedTurn) -> dict:
    """The message dict of an assistant turn that keeps its exact generated text `raw`."""
    return {"role": "assistant", "content": turn.content,
            "tool_calls": [c.to_json() for c in turn.tool_calls], "raw": raw}


_ID_RE = re.compile(r"^\s*(?:functions\.)?([A-Za-z_][\w\-]*)(?::(\d+))?\s*$")


def _parse_one(chunk: str, index: int) -> ToolCall:
    raw = TOOL_CALL_BEGIN + chunk
    complete = TOOL_CALL_END in chunk
    chunk = chunk.split(TOOL_CALL_END, 1)[0]
    if TOOL_CALL_ARG_BEGIN not in chunk:
        m = _ID_RE.match(chunk)
        name = m.group(1) if m else "?"
        return ToolCall(call_id(name, index), name, None, raw,
                        f"malformed tool call: missing {TOOL_CALL_ARG_BEGIN} after the tool name")
    head, args_text = chunk.split(TOOL_CALL_ARG_BEGIN, 1)
    m = _ID_RE.match(head)
    if not m:
        return ToolCall(call_id("?", index), "?", None, raw,
                        f"malformed tool call id {head.strip()[:60]!r}; expected functions.NAME:INDEX")
    name = m.group(1)
    cid = call_id(name, index)
    try:
        args = json.loads(args_text)
    except json.JSONDecodeError as exc:
        why = "incomplete (cut off)" if not complete else "not valid JSON"
        return ToolCall(cid, name, None, raw, f"arguments of {name} are {why}: {exc.msg} at "
                                               f"position {exc.pos}")
    if not isinstance(args, dict):
        return ToolCall(cid, name, None, raw,
                        f"arguments of {name} must be a JSON object, got {type(args).__name__}")
    return ToolCall(cid, name, args, raw, None)


def parse_assistant(text: str, first_index: int = 0) -> ParsedTurn:
    """Splits model output into content and tool calls; tolerant of partial/garbled output.

    Handles: a missing <|tool_calls_section_end|> or <|tool_call_end|> (truncated generation),
    trailing <|im_end|>, stray text between calls, bad JSON, non-object arguments, and calls
    emitted without the section tokens. Indices continue from `first_index`.
    """
    text = text.split(IM_END, 1)[0]
    if TOOL_CALLS_BEGIN in text:
        content, section = text.split(TOOL_CALLS_BEGIN, 1)
    elif TOOL_CALL_BEGIN in text:
        idx = text.index(TOOL_CALL_BEGIN)
        content, section = text[:idx], text[idx:]
    else:
        return ParsedTurn(text.strip(), ())
    section = section.split(TOOL_CALLS_END, 1)[0]
    chunks = section.split(TOOL_CALL_BEGIN)[1:]
    calls = tuple(_parse_one(c, first_index + i) for i, c in enumerate(chunks))
    if not calls:
        calls = (ToolCall(call_id("?", first_index), "?", None, section,
                          f"empty tool-call section: expected {TOOL_CALL_BEGIN}"),)
    return ParsedTurn(content.strip(), calls)
