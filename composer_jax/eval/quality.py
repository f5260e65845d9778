"""Code-quality measurements of one finished episode: what the agent's change looks like.

The environment grades the workspace and deletes it; the eval runner rebuilds the agent's final
files by replaying the episode's successful file-tool calls (`write_file`, `search_replace`,
`delete_file`) on the snapshot (`replay_edits`). Files the agent changed with shell commands cannot be
replayed: they are reported (`unreplayed_files`) and the measurements below cover the rest.

  new_pyflakes_warnings   pyflakes messages (line numbers stripped) in the agent's version of the
                          edited Python files that the snapshot's version did not have (multiset)
  diff_lines              changed lines (+/-) of the agent's change; `diff_ratio` = diff_lines over
                          the reference fix's lines_changed
  out_of_scope_files      changed files that are neither the task's editable files nor its tests
  test_edits              changed test files (the grader restores them; editing them is a smell)
"""
from __future__ import annotations

import collections
import difflib
import re
from typing import Iterable, Mapping, Sequence

_LINE = re.compile(r"^[^:]*:\d+:(\d+:)?\s*")


def replay_edits(snapshot: Mapping[str, str], calls: Sequence[Mapping]) -> dict[str, str | None]:
    """The files touched by successful file-tool calls, after replaying them in order on the
    snapshot texts: {path: final text, or None if deleted}. Paths are workspace-relative."""
    state: dict[str, str | None] = {}

    def current(rel):
        return state[rel] if rel in state else snapshot.get(rel)

    for c in calls:
        if c.get("is_error") or c.get("error"):
            continue
        args, name = c.get("arguments") or {}, c.get("name")
        if name == "write_file":
            state[_norm(args["file_path"])] = args["contents"]
        elif name == "delete_file":
            state[_norm(args["target_file"])] = None
        elif name == "search_replace":
            rel = _norm(args["file_path"])
            text = current(rel)
            if text is None:
                continue
            old, new = args["old_string"], args["new_string"]
            state[rel] = text.replace(old, new) if args.get("replace_all") else text.replace(old, new, 1)
    return state


def _norm(path: str) -> str:
    path = str(path).replace("\\", "/")
    for prefix in ("/workspace/", "./"):
        if path.startswith(prefix):
            path = path[len(prefix):]
    return path.lstrip("/")


def changed_lines(before: str | None, after: str | None) -> int:
    """Number of +/- lines of the unified diff between two texts (None = absent file)."""
    a = (before or "").splitlines()
    b = (after or "").splitlines()
    return sum(1 for ln in difflib.unified_diff(a, b, n=0, lineterm="")
               if ln[:1] in "+-" and not ln.startswith(("+++", "---")))


def pyflakes_messages(text: str, filename: str = "module.py") -> list[str]:
    """pyflakes messages of a source text with file name and line/column stripped (so a message
    survives the code moving); a syntax error counts as one message."""
    from pyflakes import api, reporter as rep

    class _Collect(rep.Reporter):
        def __init__(self):
            self.msgs = []

        def unexpectedError(self, filename, msg):
            self.msgs.append(f"error: {msg}")

        def syntaxError(self, filename, msg, lineno, offset, text):
            self.msgs.append(f"syntax error: {msg}")

        def flake(self, message):
            self.msgs.append(_LINE.sub("", str(message)))

    r = _Collect()
    api.check(text, filename, r)
    return r.msgs


def new_warnings(before: str | None, after: str | None, filename: str) -> list[str]:
    """pyflakes messages of `after` not in `before` (multiset difference)."""
    if after is None or not filename.endswith(".py"):
        return []
    old = collections.Counter(pyflakes_messages(before, filename) if before else [])
    new = collections.Counter(pyflakes_messages(after, filename))
    return sorted((new - old).elements())


def quality(snapshot: Mapping[str, str], calls: Sequence[Mapping], changed_files: Iterable[str],
            edit_files: Iterable[str], test_files: Iterable[str], reference_lines: int) -> dict:
    """All quality measurements of one episode (see the module docstring)."""
    changed = sorted(set(changed_files))
    edit, tests = set(edit_files), set(test_files)
    final = replay_edits(snapshot, calls)
    unreplayed = [f for f in changed if f not in final]
    warnings, diff = [], 0
    for rel in changed:
        if rel not in final:
            continue
        diff += changed_lines(snapshot.get(rel), final[rel])
        if rel not in tests:
            warnings += new_warnings(snapshot.get(rel), final[rel], rel)
    out_of_scope = [f for f in changed if f not in edit and f not in tests]
    return {
        "new_pyflakes_warnings": len(warnings),
        "pyflakes_messages": warnings[:20],
        "diff_lines": diff,
        "diff_ratio": diff / reference_lines if reference_lines else 0.0,
        "num_changed_files": len(changed),
        "out_of_scope_files": len(out_of_scope),
        "out_of_scope_paths": out_of_scope[:20],
        "test_edits": len([f for f in changed if f in tests]),
        "unreplayed_files": len(unreplayed),
    }
