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
`LadderOracleAgent` plays it with the `OracleAgent` interface (`messages -> assistant text`), so
SFT samples (`data/sft_env.py`) and scripted RL episodes (`rl.tasks.coding_scripted`) of ladder
tasks demonstrate reading the failure and the code before editing; `oracle_agent` picks it for
ladder tasks and `OracleAgent` for the others.
"""
from __future__ import annotations

import pathlib

from composer_jax.env.agents import OracleAgent, edit_plan
from composer_jax.env.protocol import render_assistant
from composer_jax.env.tasks.task import Task, read_files

LADDER_KINDS = ("level1", "level2")
PLAN_VERSION = 2     # bump when the plan changes: SFT stores built from the old plan are rebuilt
CONTEXT = 6          # lines shown before and after the broken line
OUTPUT_LINES = 12    # the end of the failing test's output shown in step 1
RERUN_LINES = 3      # step 4 reruns step 1's test and shows its verdict


def first_changed_line(before: str, after: str) -> int:
    """The 1-based number of the first line where `before` and `after` differ (1 if none)."""
    for i, (a, b) in enumerate(zip(before.splitlines(), after.splitlines()), start=1):
        if a != b:
            return i
    return 1


def ladder_plan(task: Task, task_dir) -> list[tuple[str, dict]]:
    """The tool calls of a ladder task's scripted episode (module docstring)."""
    task_dir = pathlib.Path(task_dir)
    before = read_files(task_dir / "snapshot", task.edit_files)
    after = read_files(task_dir / "solution", task.edit_files)
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
    plan.append(("finish", {"message": "Fixed; the failing tests pass now."}))
    return plan


class LadderOracleAgent:
    """Plays `ladder_plan` one call per turn (the `OracleAgent` interface)."""

    def __init__(self, task: Task, task_dir):
        self.plan = ladder_plan(task, task_dir)
        self.step = 0

    def __call__(self, messages: list[dict]) -> str:
        name, args = self.plan[min(self.step, len(self.plan) - 1)]
        self.step += 1
        return render_assistant("", [(name, args)], first_index=self.step - 1)


def oracle_agent(task: Task, task_dir):
    """The scripted oracle of a task: `LadderOracleAgent` for ladder kinds, else `OracleAgent`."""
    return (LadderOracleAgent if task.kind in LADDER_KINDS else OracleAgent)(task, task_dir)
