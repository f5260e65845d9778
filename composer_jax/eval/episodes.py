"""One finished evaluation episode as the runner scores it, from either episode loop.

Reference agents run the environment's text loop (`agent.episode.run_episode` -> `Episode`); model
policies run the token-level agent RL samples with (`agent.token_agent.TokenAgent` -> `Rollout`). Both
become an `EpisodeFacts`, so every metric is computed the same way whichever loop ran.

Prompt-cost accounting of a token-level episode (`rollout_prompt_tokens`): turn i of a segment
bills its whole context as prompt tokens (`Turn.sample_start`: everything before its first
sampled token); the part the engine session already held from the previous turn (up to that
turn's `sample_end`) counts as cached. The first turn of a segment (the episode's start, or the
restart after a self-summary) has nothing cached. No JAX here.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence


@dataclasses.dataclass(frozen=True)
class EpisodeFacts:
    """What the metrics need from one episode.

    calls: the tool calls in order, each {"name", "arguments", "error", "is_error"}; p2p_failed:
    pass-to-pass tests that did not pass after the agent's change; generated_tokens: sampled
    tokens (or the reference agent's metered count); prompt_tokens / cached_prompt_tokens: summed
    over turns, cached is part of prompt; error: why the episode crashed (None if it did not)."""
    resolved: bool
    f2p_passed: int
    f2p_total: int
    p2p_passed: int
    p2p_total: int
    p2p_failed: tuple[str, ...]
    grader_ok: bool
    calls: tuple[dict, ...]
    changed_files: tuple[str, ...]
    generated_tokens: int
    prompt_tokens: int
    cached_prompt_tokens: int
    num_calls: int
    num_invalid_calls: int
    turns: int
    wall_s: float
    final_message: str
    stop_reason: str
    reward: float
    error: str | None = None

    @property
    def partial(self) -> float:
        """Fraction of the fail-to-pass tests fixed."""
        return self.f2p_passed / self.f2p_total if self.f2p_total else 0.0


def facts_from_episode(ep, meter, pass_to_pass: Sequence[str]) -> EpisodeFacts:
    """From the text loop's `Episode` and the policy's `Meter` (prompt tokens per turn); a
    pass-to-pass test missing from the grade's results (it did not run) counts as failed."""
    g = ep.grade
    return EpisodeFacts(
        resolved=bool(g.resolved), f2p_passed=g.f2p_passed, f2p_total=g.f2p_total,
        p2p_passed=g.p2p_passed, p2p_total=g.p2p_total,
        p2p_failed=tuple(sorted(t for t in pass_to_pass if g.results.get(t) != "pass")),
        grader_ok=bool(g.ok), calls=tuple(ep.calls), changed_files=tuple(ep.changed_files),
        generated_tokens=int(ep.num_tokens), prompt_tokens=meter.prompt_tokens,
        cached_prompt_tokens=meter.cached_prompt_tokens, num_calls=ep.num_calls,
        num_invalid_calls=ep.num_invalid_calls, turns=ep.num_turns, wall_s=ep.duration_s,
        final_message=ep.final_message or "", stop_reason=ep.stop_reason,
        reward=float(ep.reward.total))


def rollout_prompt_tokens(segments_turns: Sequence[Sequence]) -> tuple[int, int]:
    """(prompt, cached) tokens of a token-level episode (module docstring); `segments_turns`:
    per segment, its `Turn`s (anything with `fed_start`, `sample_start`, `sample_end`)."""
    prompt = cached = 0
    for turns in segments_turns:
        held = 0                       # tokens the session's cache holds before the turn
        for t in turns:
            prompt += t.sample_start
            cached += min(held, t.sample_start)
            held = t.sample_end
    return prompt, cached


def calls_from_messages(segments_messages: Sequence[Sequence[Mapping]]) -> list[dict]:
    """The tool calls of a token-level episode, from its recorded conversation (per segment):
    each assistant turn's parsed calls, matched with their tool results by call id (a call whose
    result was never fed, e.g. after `finish`, has no "output")."""
    results = {m.get("tool_call_id"): m for seg in segments_messages for m in seg
               if m.get("role") == "tool"}
    calls = []
    for seg in segments_messages:
        for m in seg:
            if m.get("role") != "assistant":
                continue
            for c in m.get("tool_calls") or ():
                r = results.get(c.get("call_id"))
                calls.append({"call_id": c.get("call_id"), "name": c.get("name"),
                              "arguments": c.get("arguments") or {}, "error": c.get("error"),
                              "is_error": bool(c.get("error")) or bool(r and r.get("is_error")),
                              **({"output": r.get("content", "")} if r else {})})
    return calls


def facts_from_rollout(rollout, pass_to_pass: Sequence[str]) -> EpisodeFacts:
    """From a `TokenAgent` rollout (recorded with `record_messages=True`); a crashed episode
    (`rollout.error`) is unresolved with stop reason "error" and whatever it recorded."""
    info = rollout.info
    prompt, cached = rollout_prompt_tokens([s.turns for s in rollout.segments])
    calls = calls_from_messages(info.get("messages") or [])
    p2p_total = int(info.get("p2p_total", len(pass_to_pass)))
    failed = info.get("p2p_failed")
    if failed is None:               # a crash before grading: nothing is known to pass
        failed = [] if rollout.error is None else list(pass_to_pass)
    return EpisodeFacts(
        resolved=bool(info.get("resolved", False)) and rollout.error is None,
        f2p_passed=int(info.get("f2p_passed", 0)), f2p_total=int(info.get("f2p_total", 0)),
        p2p_passed=int(info.get("p2p_passed", 0)), p2p_total=p2p_total,
        p2p_failed=tuple(sorted(failed)),
        grader_ok=bool(info.get("grader_ok", rollout.error is None)), calls=tuple(calls),
        changed_files=tuple(info.get("changed_files", ())),
        generated_tokens=int(info.get("generated_tokens", rollout.num_trainable)),
        prompt_tokens=prompt, cached_prompt_tokens=cached,
        num_calls=int(info.get("num_calls", len(calls))),
        num_invalid_calls=int(info.get("num_invalid_calls", sum(bool(c["error"]) for c in calls))),
        turns=int(info.get("num_turns", 0)), wall_s=float(rollout.timing.get("duration_s", 0.0)),
        final_message=info.get("final_message", "") or "",
        stop_reason="error" if rollout.error is not None else info.get("stop_reason", ""),
        reward=float(rollout.total_reward), error=rollout.error)
