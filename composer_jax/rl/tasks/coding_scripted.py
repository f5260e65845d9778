"""rl.task=composer_jax.rl.tasks.coding_scripted: the coding family (`rl.tasks.coding`: the env
task pool's tasks, a real sandbox per episode, environment grading and rewards) whose turns are
the task's reference fix forced through the engine (`agent.token_agent.ScriptedPolicy`) instead
of sampled. For fault-injection runs and tests that need many multi-turn, tool-running episodes
in minutes: a sampled coding episode of the SFT policy takes minutes on a CPU, and a fresh
policy never makes a valid tool call. Everything but the choice of text is the real pipeline: the
token protocol, the engine (its behaviour log-probs of the forced tokens), the bubblewrap
sandbox, the turn checkpoints (the workspace as a diff against the snapshot) and the grader.

The plan, one tool call per turn (`ScriptedCoder`):
  1. run the failing tests in the sandbox, their output written into the workspace by the
     sandbox (`scratch/before.txt`: a file the sandboxed command creates, so a resumed episode
     must restore it from the checkpoint);
  2. the reference fix as `search_replace`/`write_file` calls (`env.agents.edit_plan`), one a turn;
  3. run the tests again, printing the note of step 1 (it must be there after a resume);
  4. `finish` claiming success.
The step is the number of assistant turns in the conversation (no state of its own), so a resumed
episode continues the plan where its checkpoint left it. Ladder tasks (`rl.task.levels`) play
`env.tasks.ladder_plan.ladder_plan` instead: run the failing test, read the broken line's window,
edit, run the tests again, finish (the SFT demonstrations of the same tasks).
"""
from __future__ import annotations

import dataclasses
import pathlib

from composer_jax.agent.token_agent import ScriptedPolicy
from composer_jax.config.rl import CodingTaskConfig
from composer_jax.env.agents import edit_plan
from composer_jax.env.protocol import render_assistant
from composer_jax.env.tasks.ladder_plan import LADDER_KINDS, ladder_plan
from composer_jax.env.tasks.task import Task, read_files
from composer_jax.rl.tasks.registry import register
from composer_jax.rl.tasks.coding import CodingFamily

NAME = "composer_jax.rl.tasks.coding_scripted"
NOTE = "scratch/before.txt"


@dataclasses.dataclass(frozen=True)
class ScriptedCodingTaskConfig(CodingTaskConfig):
    """The coding family's section (pool, tokenizer, init_from) under this family's name."""
    family: str = NAME


def scripted_plan(task: Task, task_dir) -> list[tuple[str, dict]]:
    """The tool calls of a scripted episode on `task` (module docstring), one per turn."""
    task_dir = pathlib.Path(task_dir)
    before = read_files(task_dir / "snapshot", task.edit_files)
    after = read_files(task_dir / "solution", task.edit_files)
    tests = " ".join(task.fail_to_pass[:20])
    plan = [("run_terminal_cmd", {"command": f"mkdir -p scratch && python -m unittest -q {tests} "
                                             f"> {NOTE} 2>&1; tail -3 {NOTE}"})]
    for rel in task.edit_files:
        plan += [(name, {"file_path": rel, **args}) for name, args in edit_plan(before[rel],
                                                                                after[rel])]
    plan.append(("run_terminal_cmd", {"command": f"python -m unittest -q {tests} 2>&1 | tail -3; "
                                                 f"echo before:; tail -1 {NOTE}"}))
    plan.append(("finish", {"message": "Fixed; the failing tests pass now.", "success": True}))
    return plan


class ScriptedCoder:
    """`messages -> assistant text`: turn k (assistant messages so far) is the plan's call k."""

    def __init__(self, plan: list[tuple[str, dict]]):
        self.plan = plan

    def __call__(self, messages: list[dict]) -> str:
        k = sum(m["role"] == "assistant" for m in messages)
        name, args = self.plan[min(k, len(self.plan) - 1)]
        return render_assistant("", [(name, args)], first_index=k)


@register
class ScriptedCodingFamily(CodingFamily):
    name = NAME
    config_cls = ScriptedCodingTaskConfig

    def turn_policy(self, task_id: str, seed: int):
        """The task's scripted plan forced through the engine (the seed is not needed)."""
        task, task_dir = self._tasks[task_id], self.pool.task_dir(task_id)
        plan = (ladder_plan if task.kind in LADDER_KINDS else scripted_plan)(task, task_dir)
        return ScriptedPolicy(ScriptedCoder(plan), self.tokenizer())
