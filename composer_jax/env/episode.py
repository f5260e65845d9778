"""The episode loop: agent <-> tools in a sandboxed workspace, with turn, token and time limits.

`run_episode(agent, task, task_dir, cfg)` opens a workspace over the task snapshot, shows the agent
the system prompt, tool declarations and the problem statement, and loops: the agent (any callable
`messages -> assistant text`) answers; the text is parsed into tool calls (`protocol`); each call
runs in the workspace (malformed ones get an error result); the results go back as tool messages.
It stops on `finish`, on a turn without tool calls (its text is the final message), or when a limit
is hit; then the workspace is graded and the reward computed. The transcript (messages, calls with
results and timings, grade, reward components) can be saved as JSONL.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import time
from typing import Callable

from composer_jax.env.config import EnvConfig
from composer_jax.env.grading import Grade, grade_workspace
from composer_jax.env.protocol import SYSTEM_PROMPT, parse_assistant
from composer_jax.env.rewards import RewardBreakdown, compute_reward
from composer_jax.env.tasks.task import Task
from composer_jax.env.tools import TOOL_SPECS
from composer_jax.env.tools.result import error
from composer_jax.env.workspace import open_workspace

Agent = Callable[[list], str]


def approx_tokens(text: str) -> int:
    """A tokenizer-free token estimate (~4 characters per token)."""
    return max(1, len(text) // 4)


@dataclasses.dataclass
class Episode:
    task_id: str
    messages: list
    calls: list
    stop_reason: str
    final_message: str
    num_turns: int
    num_tokens: int
    num_calls: int
    num_invalid_calls: int
    changed_files: list
    grade: Grade
    reward: RewardBreakdown
    duration_s: float

    def save_jsonl(self, path: pathlib.Path) -> None:
        """One JSON object per line: each message, each call, then the summary."""
        path = pathlib.Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as f:
            for m in self.messages:
                f.write(json.dumps({"type": "message", **m}) + "\n")
            for c in self.calls:
                f.write(json.dumps({"type": "call", **c}) + "\n")
            summary = {k: v for k, v in dataclasses.asdict(self).items()
                       if k not in ("messages", "calls")}
            f.write(json.dumps({"type": "summary", **summary}) + "\n")


def initial_messages(task: Task) -> list[dict]:
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": task.problem_statement}]


def run_episode(agent: Agent, task: Task, task_dir: pathlib.Path, cfg: EnvConfig, *,
                count_tokens: Callable[[str], int] = approx_tokens) -> Episode:
    """Runs one episode (see the module docstring) and returns it graded and rewarded."""
    task_dir = pathlib.Path(task_dir)
    start = time.monotonic()
    messages = initial_messages(task)
    calls_log, final, stop = [], "", "max_turns"
    tokens = turns = index = 0
    with open_workspace(task_dir / "snapshot", cfg, python_version=task.python_version) as ws:
        while turns < cfg.max_turns:
            if time.monotonic() - start > cfg.episode_time_s:
                stop = "time_limit"
                break
            text = agent(list(messages))
            turns += 1
            tokens += count_tokens(text)
            parsed = parse_assistant(text, first_index=index)
            index += len(parsed.tool_calls)
            messages.append({"role": "assistant", "content": parsed.content,
                             "tool_calls": [c.to_json() for c in parsed.tool_calls]})
            if not parsed.tool_calls:
                final, stop = parsed.content, "no_tool_call"
                break
            finished = False
            for call in parsed.tool_calls:
                t0 = time.monotonic()
                if call.error is not None:
                    result = error(call.error)
                    ws.num_calls += 1
                    ws.num_invalid_calls += 1
                else:
                    result = ws.call(call.name, call.arguments)
                calls_log.append({"call_id": call.call_id, "name": call.name,
                                  "arguments": call.arguments, "error": call.error,
                                  "output": result.output, "is_error": result.is_error,
                                  "duration_s": time.monotonic() - t0})
                messages.append({"role": "tool", "tool_call_id": call.call_id,
                                 "content": result.output})
                if result.finished:
                    final, finished = result.output, True
                    break
            if finished:
                stop = "finish"
                break
            if tokens >= cfg.max_tokens:
                stop = "max_tokens"
                break
        changed = ws.changed_files()
        grade = grade_workspace(ws, task, task_dir / "snapshot")
        num_calls, num_invalid = ws.num_calls, ws.num_invalid_calls
    reward = compute_reward(resolved=grade.resolved, f2p_fraction=grade.f2p_fraction,
                            num_calls=num_calls, num_invalid_calls=num_invalid, num_tokens=tokens,
                            num_turns=turns, changed_files=changed,
                            editable_files=task.edit_files, final_message=final, cfg=cfg)
    return Episode(task.task_id, messages, calls_log, stop, final, turns, tokens, num_calls,
                   num_invalid, changed, grade, reward, time.monotonic() - start)
