"""Reference agents: the scripted oracle (applies the reference fix through the tools) and the null
agent (finishes at once). An agent is any callable `messages -> assistant text`; both speak the
chat protocol, so an episode with them exercises the parser and the tools end to end.
"""
from __future__ import annotations

import difflib
import pathlib

from composer_jax.env.protocol import render_assistant
from composer_jax.env.tasks.task import Task, read_files

MAX_HUNKS = 8


def null_agent(messages: list[dict]) -> str:
    """Finishes immediately without touching anything."""
    return render_assistant("", [("finish", {"message": "I did not change anything."})])


def _unique_hunk(cur: list[str], tgt: list[str], text: str, op) -> tuple[str, str]:
    """(old, new) strings for one diff opcode, widened with context lines until `old` is unique."""
    _, i1, i2, j1, j2 = op
    for c in range(0, len(cur) + 1):
        a, b = max(0, i1 - c), min(len(cur), i2 + c)
        old = "".join(cur[a:b])
        if old and text.count(old) == 1:
            return old, "".join(cur[a:i1] + tgt[j1:j2] + cur[i2:b])
    return text, "".join(tgt)


def edit_plan(current: str, target: str) -> list[tuple[str, dict]]:
    """Tool calls turning `current` into `target`: search_replace hunks, or one write_file."""
    calls, text = [], current
    for _ in range(MAX_HUNKS):
        cur, tgt = text.splitlines(True), target.splitlines(True)
        ops = [o for o in difflib.SequenceMatcher(None, cur, tgt, autojunk=False).get_opcodes()
               if o[0] != "equal"]
        if not ops:
            return calls
        old, new = _unique_hunk(cur, tgt, text, ops[0])
        calls.append(("search_replace", {"old_string": old, "new_string": new}))
        text = text.replace(old, new, 1)
    return [("write_file", {"contents": target})] if text != target else calls


class OracleAgent:
    """Replays the task's reference solution: edits, one test run, then `finish`."""

    def __init__(self, task: Task, task_dir: pathlib.Path):
        task_dir = pathlib.Path(task_dir)
        before = read_files(task_dir / "snapshot", task.edit_files)
        after = read_files(task_dir / "solution", task.edit_files)
        self.plan: list[tuple[str, dict]] = []
        for rel in task.edit_files:
            for name, args in edit_plan(before[rel], after[rel]):
                key = "file_path"
                self.plan.append((name, {key: rel, **args}))
        visible = [t for t in task.fail_to_pass if t not in task.held_back]
        ids = " ".join(visible[:20])
        self.plan.append(("run_terminal_cmd", {"command": f"python -m unittest -q {ids} 2>&1 | tail -3"}))
        self.plan.append(("finish", {"message": "Fixed; the failing tests pass now."}))
        self.step = 0

    def __call__(self, messages: list[dict]) -> str:
        name, args = self.plan[min(self.step, len(self.plan) - 1)]
        self.step += 1
        return render_assistant("", [(name, args)], first_index=self.step - 1)
