"""The episode loop: agent <-> tools in a sandboxed workspace, with turn, token and time limits.

`run_loop(ws, turns, cfg, start)` is THE loop (one copy for every agent): it asks a `TurnTaker`
for the next assistant text, parses its tool calls (`protocol`), runs each in the workspace
(malformed ones get an error result), and stops on `finish`, on a turn without tool calls (its
text is the final message), or at a limit (turns, tokens, time, or the turn taker's own stop such
as a full context). The text-level episode below and the token-level agent
(`agent.token_agent.TokenAgent`, used by RL and by eval's model policies) both run it.

`run_episode(agent, task, task_dir, cfg)` opens a workspace over the task snapshot, shows the agent
the system prompt, tool declarations and the problem statement, and loops: the agent (any callable
`messages -> assistant text`, or `messages -> AgentTurn(text, num_tokens)` for an agent that knows
its real token count) answers; the text is parsed into tool calls (`protocol`); each call
runs in the workspace (malformed ones get an error result); the results go back as tool messages.
It stops on `finish`, on a turn without tool calls (its text is the final message), or when a limit
is hit; then the workspace is graded (`grading.py`, tampering included) and the reward computed.

Token counts (for `max_tokens` and the length penalty) are, in order of preference: the agent's own
count (`AgentTurn.num_tokens`, e.g. the sampled tokens of a token-level policy), a tokenizer passed
as `count_tokens`, and only for text-only agents without either the explicitly approximate
`approx_tokens_chars4` (len/4). `Episode.token_count_source` says which was used; RL should never
see "chars/4". The transcript (messages, calls with
results and timings, grade, reward components) can be saved as JSONL.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
import time
from typing import Callable, Protocol

from composer_jax.config.env import EnvConfig
from composer_jax.env.grading import Grade, grade_workspace
from composer_jax.env.protocol import SYSTEM_PROMPT, parse_assistant
from composer_jax.env.rewards import RewardBreakdown, compute_reward
from composer_jax.env.tasks.task import Task
from composer_jax.env.tools import TOOL_SPECS
from composer_jax.env.tools.result import error
from composer_jax.env.workspace import open_workspace



@dataclasses.dataclass(frozen=True)
class AgentTurn:
    """One assistant turn from an agent that knows how many tokens it generated."""
    text: str
    num_tokens: int


Agent = Callable[[list], "str | AgentTurn"]


def approx_tokens_chars4(text: str) -> int:
    """A tokenizer-free token estimate (~4 characters per token): the fallback for text-only
    agents, never the count to train on."""
    return max(1, len(text) // 4)


approx_tokens = approx_tokens_chars4  # the old name


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
    token_count_source: str = "chars/4"   # "agent" | "tokenizer" | "chars/4"
    tampered: bool = False
    tamper_reasons: tuple = ()

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


def execute_call(ws, call):
    """Run one parsed tool call in workspace `ws`; a malformed call (`call.error`) is not run but
    returns its error result and counts as an invalid call (and as a call) on the workspace."""
    if call.error is not None:
        ws.num_calls += 1
        ws.num_invalid_calls += 1
        return error(call.error)
    return ws.call(call.name, call.arguments)


def initial_messages(task: Task) -> list[dict]:
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": task.problem_statement}]


class TurnTaker(Protocol):
    """One agent inside `run_loop`: `before_turn()` -> a stop reason or None; `turn()` -> (the
    assistant text, tokens generated since the last call); `on_reply(text, parsed)` after the
    parse; `on_result(call, result, seconds)` after each executed call."""

    def before_turn(self) -> str | None: ...
    def turn(self) -> tuple[str, int]: ...
    def on_reply(self, text: str, parsed) -> None: ...
    def on_result(self, call, result, seconds: float) -> None: ...


@dataclasses.dataclass(frozen=True)
class LoopEnd:
    """How `run_loop` ended: stop reason, final message, assistant turns, tokens counted."""
    stop: str
    final: str
    turns: int
    tokens: int


@dataclasses.dataclass(frozen=True)
class LoopState:
    """Where the loop stands between turns: assistant turns, tokens counted, tool calls parsed
    (the next call's index). A resumed episode restarts the loop from one."""
    turns: int = 0
    tokens: int = 0
    index: int = 0


def run_loop(ws, agent: TurnTaker, cfg: EnvConfig, start: float,
             state: LoopState = LoopState(),
             on_turn: Callable[[LoopState], None] | None = None) -> LoopEnd:
    """THE episode loop (module docstring); `start`: the episode's `time.monotonic()` start;
    `state`: where to start (a resumed episode's last completed turn); `on_turn(state)`: called
    after every completed turn that the loop continues from (the episode checkpoint)."""
    turns, tokens, index = state.turns, state.tokens, state.index
    while turns < cfg.max_turns:
        if time.monotonic() - start > cfg.episode_time_s:
            return LoopEnd("time_limit", "", turns, tokens)
        stop = agent.before_turn()
        if stop is not None:
            return LoopEnd(stop, "", turns, tokens)
        text, n = agent.turn()
        turns, tokens = turns + 1, tokens + int(n)
        parsed = parse_assistant(text, first_index=index)
        index += len(parsed.tool_calls)
        agent.on_reply(text, parsed)
        if not parsed.tool_calls:
            return LoopEnd("no_tool_call", parsed.content, turns, tokens)
        for call in parsed.tool_calls:
            t0 = time.monotonic()
            result = execute_call(ws, call)
            agent.on_result(call, result, time.monotonic() - t0)
            if result.finished:
                return LoopEnd("finish", result.output, turns, tokens)
        if tokens >= cfg.max_tokens:
            return LoopEnd("max_tokens", "", turns, tokens)
        if on_turn is not None and turns < cfg.max_turns:
            on_turn(LoopState(turns, tokens, index))
    return LoopEnd("max_turns", "", turns, tokens)


class _TextTurns:
    """The text-level agent (`messages -> str | AgentTurn`) as a TurnTaker: keeps the messages
    and the calls log, counts tokens (module docstring)."""

    def __init__(self, agent: Agent, task: Task, count_tokens: Callable[[str], int] | None):
        self.agent, self.count_tokens = agent, count_tokens
        self.messages = initial_messages(task)
        self.calls: list[dict] = []
        self.sources: set[str] = set()

    def before_turn(self) -> None:
        return None

    def turn(self) -> tuple[str, int]:
        reply = self.agent(list(self.messages))
        if isinstance(reply, AgentTurn):
            self.sources.add("agent")
            return reply.text, int(reply.num_tokens)
        if self.count_tokens is not None:
            self.sources.add("tokenizer")
            return reply, self.count_tokens(reply)
        self.sources.add("chars/4")
        return reply, approx_tokens_chars4(reply)

    def on_reply(self, text: str, parsed) -> None:
        self.messages.append({"role": "assistant", "content": parsed.content,
                              "tool_calls": [c.to_json() for c in parsed.tool_calls]})

    def on_result(self, call, result, seconds: float) -> None:
        self.calls.append({"call_id": call.call_id, "name": call.name,
                           "arguments": call.arguments, "error": call.error,
                           "output": result.output, "is_error": result.is_error,
                           "duration_s": seconds})
        self.messages.append({"role": "tool", "tool_call_id": call.call_id,
                              "content": result.output})

    def source(self) -> str:
        s = self.sources
        return "chars/4" if "chars/4" in s else ("tokenizer" if "tokenizer" in s
                                                 else "agent" if s else "chars/4")


def run_episode(agent: Agent, task: Task, task_dir: pathlib.Path, cfg: EnvConfig, *,
                count_tokens: Callable[[str], int] | None = None) -> Episode:
    """Runs one episode (see the module docstring) and returns it graded and rewarded.

    `count_tokens`: a tokenizer's `text -> number of tokens`, used for turns whose agent does not
    report its own count; None falls back to `approx_tokens_chars4`."""
    task_dir = pathlib.Path(task_dir)
    start = time.monotonic()
    turns = _TextTurns(agent, task, count_tokens)
    with open_workspace(task_dir / "snapshot", cfg, python_version=task.python_version,
                        task=task) as ws:
        end = run_loop(ws, turns, cfg, start)
        grade = grade_workspace(ws, task, task_dir / "snapshot")
        num_calls, num_invalid = ws.num_calls, ws.num_invalid_calls
    changed = grade.changed_files
    reward = compute_reward(resolved=grade.resolved, f2p_fraction=grade.f2p_fraction,
                            num_calls=num_calls, num_invalid_calls=num_invalid,
                            num_tokens=end.tokens, num_turns=end.turns, changed_files=changed,
                            editable_files=task.edit_files, final_message=end.final, cfg=cfg,
                            tampered=grade.tampered)
    if grade.tampered:
        logging.getLogger(__name__).warning("episode on %s tampered with the grader: %s",
                                            task.task_id, "; ".join(grade.tamper_reasons[:5]))
    # the episode reports every file the agent touched (new source files too: the eval quality
    # metrics count them out of scope); the reward's outside-edit term sees only snapshot files
    touched = sorted(set(changed) | set(grade.added_modules)
                     | {rel for rel, why in grade.ignored_changes if why.startswith("new file")})
    return Episode(task.task_id, turns.messages, turns.calls, end.stop, end.final, end.turns,
                   end.tokens, num_calls, num_invalid, touched, grade, reward,
                   time.monotonic() - start, token_count_source=turns.source(),
                   tampered=grade.tampered, tamper_reasons=grade.tamper_reasons)
