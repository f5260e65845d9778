"""JSON-schema definitions of the coding-assistant tools and validation of call arguments.

`TOOL_SPECS` is what the chat template renders into the system prompt (name, description,
parameters). `validate_arguments` checks a call against its schema: unknown tool, non-object
arguments, missing required, unexpected extra, or wrongly typed arguments all produce a clear
message for the agent (never an exception).
"""
from __future__ import annotations

from typing import Any


def _spec(name: str, description: str, properties: dict, required: tuple[str, ...]) -> dict:
    return {"name": name, "description": description,
            "parameters": {"type": "object", "properties": properties, "required": list(required),
                           "additionalProperties": False}}


_S = {"type": "string"}
_I = {"type": "integer"}
_B = {"type": "boolean"}

TOOL_SPECS: tuple[dict, ...] = (
    _spec("read_file", "Read a window of lines of a file (1-based, inclusive). Without a range, "
          "reads from the start up to the line cap.",
          {"target_file": {**_S, "description": "path relative to the workspace root"},
           "start_line": {**_I, "description": "first line (1-based)"},
           "end_line": {**_I, "description": "last line (inclusive)"}}, ("target_file",)),
    _spec("list_dir", "List a directory of the workspace (directories end with '/').",
          {"relative_workspace_path": {**_S, "description": "directory; '.' is the root"}}, ()),
    _spec("grep_search", "Regex search over file contents (Python `re` syntax); hits are capped.",
          {"query": {**_S, "description": "regular expression"},
           "include_pattern": {**_S, "description": "glob of files to search, e.g. '*.py'"},
           "case_sensitive": {**_B, "description": "default true"}}, ("query",)),
    _spec("file_search", "Find files by name: a glob (e.g. '**/test_*.py') or a fuzzy name.",
          {"query": {**_S, "description": "glob or part of a file name"}}, ("query",)),
    _spec("codebase_search", "Semantic search over the code (functions, classes, blocks): BM25 "
          "plus a sentence-embedding model; returns the best chunks with their line ranges.",
          {"query": {**_S, "description": "what you are looking for, in words or code"},
           "target_directories": {"type": "array", "items": _S,
                                  "description": "limit the search to these directories"}},
          ("query",)),
    _spec("search_replace", "Replace one exact occurrence of old_string with new_string in a file. "
          "old_string must match exactly (whitespace included) and be unique in the file unless "
          "replace_all is true; include enough surrounding lines to make it unique.",
          {"file_path": _S, "old_string": _S, "new_string": _S, "replace_all": _B},
          ("file_path", "old_string", "new_string")),
    _spec("write_file", "Create or overwrite a file with the given contents.",
          {"file_path": _S, "contents": _S}, ("file_path", "contents")),
    _spec("delete_file", "Delete a file.", {"target_file": _S}, ("target_file",)),
    _spec("run_terminal_cmd", "Run a bash command in the sandboxed workspace (no network). "
          "Output is truncated; long commands time out. With is_background the command keeps "
          "running (output discarded) until the episode ends.",
          {"command": _S, "is_background": _B,
           "timeout": {**_I, "description": "seconds (capped by the environment)"}},
          ("command",)),
    _spec("finish", "End the episode with a short final message to the user; `success` says "
          "whether you believe the task is done (a false claim is penalised).",
          {"message": _S, "success": {**_B, "description": "true if the task is done"}},
          ("message",)),
)

SPECS_BY_NAME: dict[str, dict] = {s["name"]: s for s in TOOL_SPECS}
TOOL_NAMES: tuple[str, ...] = tuple(SPECS_BY_NAME)


def declared_specs(names: tuple[str, ...] = ()) -> tuple[dict, ...]:
    """The tool declarations a prompt carries (`env.prompt_tools`): those of `names` in TOOL_SPECS
    order, every tool for (). Unknown names are a ValueError."""
    unknown = sorted(set(names) - set(TOOL_NAMES))
    if unknown:
        raise ValueError(f"env.prompt_tools: unknown tools {unknown}; known: {list(TOOL_NAMES)}")
    return tuple(s for s in TOOL_SPECS if not names or s["name"] in names)

_PY_TYPES = {"string": (str,), "integer": (int,), "boolean": (bool,), "array": (list,)}


def _type_ok(value: Any, schema: dict) -> bool:
    t = schema["type"]
    if t == "integer" and isinstance(value, bool):
        return False
    if not isinstance(value, _PY_TYPES[t]):
        return False
    if t == "array":
        return all(_type_ok(v, schema["items"]) for v in value)
    return True


def validate_arguments(name: Any, arguments: Any) -> str | None:
    """None if `arguments` fit tool `name`'s schema, else a message saying what is wrong."""
    if not isinstance(name, str) or name not in SPECS_BY_NAME:
        return f"unknown tool {name!r}; available tools: {', '.join(TOOL_NAMES)}"
    params = SPECS_BY_NAME[name]["parameters"]
    if not isinstance(arguments, dict):
        return (f"arguments of {name} must be a JSON object, got {type(arguments).__name__}")
    props = params["properties"]
    missing = [k for k in params["required"] if k not in arguments]
    if missing:
        return f"{name}: missing required argument(s) {missing}; expected {sorted(props)}"
    extra = sorted(k for k in arguments if k not in props)
    if extra:
        return f"{name}: unexpected argument(s) {extra}; valid arguments are {sorted(props)}"
    for k, v in arguments.items():
        if not _type_ok(v, props[k]):
            want = props[k]["type"] + (" of strings" if props[k]["type"] == "array" else "")
            return f"{name}: argument {k!r} must be {want}, got {type(v).__name__} {v!r:.60}"
    return None
