"""Renamed copies of an oracle demonstration: the same episode with other names, so imitating it
needs copying from the context, not recalling the training task.

A ladder demonstration's tool calls are mostly copies: the test id from the task statement, the
file and line from the traceback, the broken line from `read_file`'s output, the right name from
CPython's "Did you mean" hint. A few hundred demonstrations can be learnt by heart instead (the
policy then writes a *training* module's names into a held-out task). `renamed_messages` rewrites
one conversation with a consistent random substitution of

  - every identifier that the assistant's tool-call arguments contain (test ids, module and file
    names, the names on the broken line, the misspelt and the hinted name), except Python keywords,
    builtins and the protocol's own words (`KEEP`), each to a distinct name drawn from `names`;
  - the line number the assistant reads (`read_file`'s start/end line, when >= `MIN_LINE`), to
    a random number,

applied to every message but the system prompt (task statement, tool outputs, assistant turns and
their arguments), so the renamed episode is as self-consistent as the original: what the
assistant writes can be copied from what it saw, and from nothing else. Pure functions; the SFT
builder (`data.sft_env`, `data.sft_renames`) draws the names from its training tasks' sources,
never from a held-out module (`name_pool`).
"""
from __future__ import annotations

import builtins
import keyword
import random
import re
from collections.abc import Iterable, Sequence

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
NUMBER = re.compile(r"(?<![A-Za-z0-9_.])\d+(?![A-Za-z0-9_])")
MIN_LINE = 20            # smaller line numbers could be the protocol's own numbers (tail -n 12)
MAX_LINE = 3000
# the command templates' words and the finish message's (`ladder_plan`, `sft_env.HASTY_FINISH`)
# (and grep's: PLAN_VERSION 5's first call; tests/data/test_sft_rename.py checks the template's words are here)
PROTOCOL_WORDS = frozenset({"python", "m", "unittest", "tail", "n", "Fixed", "the", "failing", "tests",
                            "pass", "now", "py", "self", "cls", "workspace", "grep", "B3", "m1", "Error"})
KEEP = frozenset(keyword.kwlist) | frozenset(keyword.softkwlist) | frozenset(dir(builtins)) | PROTOCOL_WORDS


def argument_strings(value) -> Iterable[str]:
    """Every string inside a tool call's arguments (nested lists and dicts included)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from argument_strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from argument_strings(v)


def assistant_calls(messages: Sequence[dict]) -> Iterable[dict]:
    """The tool calls of the assistant turns, in order."""
    for m in messages:
        if m["role"] == "assistant":
            yield from m.get("tool_calls") or ()


def known_names(messages: Sequence[dict]) -> set[str]:
    """Names an edit brings in that nothing before it showed (a keyword argument's right spelling
    with no hint: knowledge, not a copy), with the names it removes. Renaming them would make the
    edit unpredictable, so they are kept."""
    shown: set[str] = set()
    out: set[str] = set()
    for m in messages:
        if m["role"] != "assistant":
            shown.update(IDENT.findall(str(m.get("content", ""))))
            continue
        for call in m.get("tool_calls") or ():
            args = call.get("arguments") or {}
            if call.get("name") == "search_replace":
                old = set(IDENT.findall(str(args.get("old_string", ""))))
                new = set(IDENT.findall(str(args.get("new_string", ""))))
                if not (new - old) <= shown:
                    out |= (new - old) | (old - new)
    return out


def copied_names(messages: Sequence[dict]) -> list[str]:
    """The identifiers the assistant's tool calls write, in first-use order, minus `KEEP` and the
    names an edit knows rather than copies (`known_names`)."""
    keep = KEEP | known_names(messages)
    seen: dict[str, None] = {}
    for call in assistant_calls(messages):
        for s in argument_strings(call.get("arguments")):
            seen.update((word, None) for word in IDENT.findall(s) if word not in keep)
    return list(seen)


def read_lines(messages: Sequence[dict]) -> list[int]:
    """The line numbers the assistant's `read_file` calls ask for (>= MIN_LINE)."""
    out = set()
    for call in assistant_calls(messages):
        if call.get("name") == "read_file":
            args = call.get("arguments") or {}
            out.update(v for k in ("start_line", "end_line") if isinstance(v := args.get(k), int)
                       and not isinstance(v, bool) and v >= MIN_LINE)
    return sorted(out)


def _substitute(text: str, names: dict[str, str], numbers: dict[int, int]) -> str:
    text = IDENT.sub(lambda m: names.get(m.group(), m.group()), text)
    if numbers:
        text = NUMBER.sub(lambda m: str(numbers.get(int(m.group()), m.group())), text)
    return text


def _map(value, names: dict[str, str], numbers: dict[int, int]):
    if isinstance(value, str):
        return _substitute(value, names, numbers)
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return numbers.get(value, value)
    if isinstance(value, dict):
        return {k: _map(v, names, numbers) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_map(v, names, numbers) for v in value)
    return value


def renamed_messages(messages: Sequence[dict], names: Sequence[str], rng: random.Random) -> list[dict]:
    """`messages` with its copied names and read line numbers replaced consistently (module doc).
    `names`: candidate identifiers; a name already in the conversation is never drawn, so no two
    originals map to one name. Tool-call ids, tool names and argument keys are kept."""
    text = "\n".join(str(m.get("content", "")) for m in messages) + "\n" + "\n".join(
        s for m in messages for c in (m.get("tool_calls") or ()) for s in argument_strings(c.get("arguments")))
    present = set(IDENT.findall(text))
    originals = copied_names(messages)
    free = [n for n in names if n not in present]
    if len(free) < len(originals):
        raise ValueError(f"{len(free)} unused candidate names for {len(originals)} names to replace")
    name_map = dict(zip(originals, rng.sample(free, len(originals))))
    present_numbers = {int(x) for x in NUMBER.findall(text)}
    number_map: dict[int, int] = {}
    for line in read_lines(messages):
        choice = rng.randrange(MIN_LINE, MAX_LINE)
        while choice in present_numbers or choice in number_map.values():
            choice = rng.randrange(MIN_LINE, MAX_LINE)
        number_map[line] = choice
    out = []
    for m in messages:
        if m["role"] == "system":
            out.append(dict(m))
            continue
        new = {**m, "content": _map(m.get("content", ""), name_map, number_map)}
        if m.get("tool_calls"):
            new["tool_calls"] = [{**c, "arguments": _map(c.get("arguments"), name_map, number_map),
                                  "raw": _map(c.get("raw", ""), name_map, number_map)}
                                 for c in m["tool_calls"]]
        out.append(new)
    return out


NAME_LIKE = re.compile(r"_?[A-Za-z]+(_[A-Za-z]+)*")


def name_pool(texts: Iterable[str], exclude: Iterable[str], min_len: int = 3, max_len: int = 24) -> list[str]:
    """Sorted distinct identifiers of `texts` usable as replacement names: words of letters and
    single underscores (no digits: `A0000F8` is a table entry, not a name), not in `KEEP`, between
    `min_len` and `max_len` characters, and not containing any `exclude` word (held-out module
    names: a renamed training row never spells one)."""
    banned = [e.lower() for e in exclude if e]
    out = set()
    for t in texts:
        for word in IDENT.findall(t):
            if (min_len <= len(word) <= max_len and word not in KEEP and NAME_LIKE.fullmatch(word)
                    and not any(b in word.lower() for b in banned)):
                out.add(word)
    return sorted(out)
