"""The scripted oracle episode of a ladder task: the protocol of a careful fix, not just the answer.

`ladder_plan(task, task_dir)`, one tool call per turn:
  1. run the first visible failing test and show the end of its output (the traceback: for
     level 1 the module's line and CPython's "Did you mean" hint; for level 2 the failed
     assertion);
  2. `read_file` of the broken line alone when the fix is a one-line hunk (level 1: the line the
     traceback named, so the call copies its number twice and needs no arithmetic, and the next
     call's `old_string` is a copy of the line shown), else a window of CONTEXT lines around it;
  3. the reference fix as `search_replace` calls (`env.agents.edit_plan`);
  4. run the test of step 1 again (the same command but the tail: 50-70 tokens to generate; the
     list of every failing test id, up to 20, made this turn up to 420 tokens);
  5. `finish`.
`LadderOracleAgent` plays a ladder task with the `OracleAgent` interface (`messages -> assistant
text`), so SFT samples (`data/sft_env.py`) of ladder tasks demonstrate reading the failure before
editing. A level-1 one-line fix whose broken line CPython's traceback shows (`traceback_edit`)
gets the short episode a careful engineer uses when the output already shows the line:

  1. run the whole suite (`python -m unittest`, discovery in the workspace: a constant command,
     nothing to copy) and show its first error line with the 3 lines above it (`FIRST_ERROR`): the
     frame that raised, its source line, CPython's carets under it when it prints them, and the
     error with its hint; nothing else, so the copies of step 2 come from the only frame shown
     (PLAN_VERSION 4 showed the output's last 12 lines: the test file's frame above it and the
     summary below);
  2. if that frame is the broken line (`last_frame`: file, number, source as CPython
     prints it, stripped), one `search_replace` in that file of the broken name by the right one
     when the broken name occurs once in the file (the name the error message quotes, the right
     one CPython's "Did you mean" hint names or the line itself shows), else of the shown source
     line by the fixed one; otherwise (the tail ends in another test's failure) the plan above
     from step 1, which runs the first failing test by id;
  3. run the suite again (its verdict), 4. `finish`.

Scripted RL episodes (`rl.tasks.coding_scripted`) replay `ladder_plan`. `oracle_agent` picks
`LadderOracleAgent` for ladder tasks and `OracleAgent` for the others.
"""
from __future__ import annotations

import pathlib
import re

from composer_jax.env.agents import OracleAgent, edit_plan
from composer_jax.env.protocol import render_assistant
from composer_jax.env.tasks.task import Task, read_files

LADDER_KINDS = ("level1", "level2")
PLAN_VERSION = 5     # bump when the plan changes: SFT stores built from the old plan are rebuilt
CONTEXT = 6          # lines shown before and after the broken line
OUTPUT_LINES = 12    # the end of the failing test's output shown in step 1
RERUN_LINES = 3      # step 4 reruns step 1's test and shows its verdict
SUITE = "python -m unittest"                 # the whole suite by discovery in /workspace
FIRST_ERROR = "grep -B3 -m1 'Error: '"       # the short plan's step 1 shows the suite's first error
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
FRAME = re.compile(r'File "/workspace/([^"]+)", line (\d+)')
FINISH = {"message": "Fixed; the failing tests pass now."}


def first_changed_line(before: str, after: str) -> int:
    """The 1-based number of the first line where `before` and `after` differ (1 if none)."""
    for i, (a, b) in enumerate(zip(before.splitlines(), after.splitlines()), start=1):
        if a != b:
            return i
    return 1


def sources(task: Task, task_dir) -> tuple[dict[str, str], dict[str, str]]:
    """The task's edit files before (snapshot) and after (solution) the reference fix."""
    task_dir = pathlib.Path(task_dir)
    return read_files(task_dir / "snapshot", task.edit_files), read_files(task_dir / "solution", task.edit_files)


def ladder_plan(task: Task, task_dir, texts=None) -> list[tuple[str, dict]]:
    """The tool calls of a ladder task's scripted episode (module docstring); `texts`: `sources`
    when the caller has read them already."""
    before, after = texts or sources(task, task_dir)
    visible = [t for t in task.fail_to_pass if t not in task.held_back] or list(task.fail_to_pass)
    rel = task.edit_files[0]
    line = first_changed_line(before[rel], after[rel])
    edits = [(name, {"file_path": r, **args})
             for r in task.edit_files for name, args in edit_plan(before[r], after[r])]
    one_line = (len(edits) == 1 and edits[0][0] == "search_replace"
                and edits[0][1]["old_string"].rstrip("\n").count("\n") == 0)
    window = (line, line) if one_line else (max(1, line - CONTEXT), line + CONTEXT)
    plan = [("run_terminal_cmd", {"command": f"python -m unittest {visible[0]} 2>&1 | "
                                             f"tail -n {OUTPUT_LINES}"}),
            ("read_file", {"target_file": rel, "start_line": window[0], "end_line": window[1]})]
    plan += edits
    plan.append(("run_terminal_cmd", {"command": f"python -m unittest {visible[0]} 2>&1 | "
                                                 f"tail -n {RERUN_LINES}"}))
    plan.append(("finish", FINISH))
    return plan


def last_frame(output: str) -> tuple[str, int, str] | None:
    """(file relative to /workspace, line number, source line stripped) of the last traceback frame
    in a tool output that names a workspace file; None when there is none."""
    lines = output.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        m = FRAME.search(lines[i])
        if m:
            return m.group(1), int(m.group(2)), lines[i + 1].strip() if i + 1 < len(lines) else ""
    return None


def renamed_name(old_line: str, new_line: str, text: str) -> tuple[str, str] | None:
    """(broken, right) when `new_line` is `old_line` with one identifier replaced and the broken
    one occurs exactly once in `text` (so a `search_replace` of the name alone is the fix)."""
    a, b = IDENT.findall(old_line), IDENT.findall(new_line)
    diff = [(x, y) for x, y in zip(a, b) if x != y]
    if len(a) != len(b) or len(diff) != 1:
        return None
    broken, right = diff[0]
    if text.count(broken) != 1 or old_line.replace(broken, right, 1) != new_line:
        return None
    return broken, right


def traceback_edit(task: Task, task_dir, texts=None) -> tuple[str, int, str, str, str, str] | None:
    """(file, line, shown, fixed, old, new) of a level-1 task whose reference fix changes one line:
    `shown` and `fixed` that line before and after, stripped as a traceback prints it; `old` and
    `new` what the `search_replace` writes (`renamed_name`'s pair, else `shown` and `fixed`). None
    when the fix is not one line or `shown` is not unique in the file (a `search_replace` of it
    would be ambiguous); `texts` as for `ladder_plan`."""
    if task.kind != "level1" or len(task.edit_files) != 1:
        return None
    rel = task.edit_files[0]
    before, after = (t[rel] for t in texts or sources(task, task_dir))
    b, a = before.splitlines(), after.splitlines()
    changed = [i for i, (x, y) in enumerate(zip(b, a)) if x != y]
    if len(a) != len(b) or len(changed) != 1:
        return None
    line = changed[0] + 1
    old, new = b[line - 1].strip(), a[line - 1].strip()
    if not old or before.count(old) != 1:
        return None
    return rel, line, old, new, *(renamed_name(old, new, before) or (old, new))


def suite_command(lines: int) -> dict:
    """`run_terminal_cmd` arguments that run the whole suite and show the last `lines` lines."""
    return {"command": f"{SUITE} 2>&1 | tail -n {lines}"}


def first_error_command() -> dict:
    """`run_terminal_cmd` arguments that run the whole suite and show its first error line and the
    3 lines above it (the frame that raised it; module docstring, step 1)."""
    return {"command": f"{SUITE} 2>&1 | {FIRST_ERROR}"}


class LadderOracleAgent:
    """Plays a ladder task one call per turn (the `OracleAgent` interface; module docstring): the
    short traceback episode when `traceback_edit` applies and the suite's output shows the broken
    line, else `ladder_plan`."""

    def __init__(self, task: Task, task_dir):
        texts = sources(task, task_dir)
        self.plan = ladder_plan(task, task_dir, texts)
        self.edit = traceback_edit(task, task_dir, texts)
        self.queue = [("run_terminal_cmd", first_error_command())] if self.edit else list(self.plan)
        self.last = self.queue[0]

    def __call__(self, messages: list[dict]) -> str:
        turn = sum(m["role"] == "assistant" for m in messages)
        if self.edit and turn == 1:
            rel, line, shown, _, old, new = self.edit
            output = next((str(m.get("content", "")) for m in reversed(messages) if m["role"] == "tool"), "")
            if last_frame(output) == (rel, line, shown):
                self.queue = [("search_replace", {"file_path": rel, "old_string": old, "new_string": new}),
                              ("run_terminal_cmd", suite_command(RERUN_LINES)),
                              ("finish", FINISH)]
            else:
                self.queue = list(self.plan)
        if self.queue:
            self.last = self.queue.pop(0)
        return render_assistant("", [self.last], first_index=turn)


def oracle_agent(task: Task, task_dir):
    """The scripted oracle of a task: `LadderOracleAgent` for ladder kinds, else `OracleAgent`."""
    return (LadderOracleAgent if task.kind in LADDER_KINDS else OracleAgent)(task, task_dir)
