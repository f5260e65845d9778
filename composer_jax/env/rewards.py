"""Episode reward: resolved (SWE-bench rules) plus behaviour and quality terms, minus effort.

  total = base + valid_calls + communication
          - invalid_calls - length - outside_edits - false_claim - tampering
  base          1 if resolved, else reward_partial_credit * (fraction of FAIL_TO_PASS passing)
  invalid_calls reward_invalid_call per malformed/failed call, capped at reward_invalid_call_cap
                (an invalid call also counts as a call in the effort, so it never pays better
                than a valid one)
  valid_calls   reward_valid_call * base * (valid calls / calls): tool-use accuracy, paid in
                proportion to the task's success (doing nothing, or many calls, earns nothing
                extra); an invalid call lowers the fraction and pays reward_invalid_call, so it
                never pays better than a valid one
  length        reward_length_coef * C(x), C(x) = ((1 + k x)^(1-q) - 1) / (k (1-q))  (concave;
                -> ln(1 + k x) / k as q -> 1), the effort
                x = w_tok * content + w_call_tok * tool-call tokens + w_out * tool-output tokens
                    + w_final * final-message tokens + w_call * calls + w_turn * turns
                from real token counts (`EffortCounts`, split by a token-level agent); without
                them x = w_tok * tokens + w_call * calls + w_turn * turns
  communication reward_communication for a clear, short final message on a resolved task: non-empty,
                claiming success, at most reward_communication_max_tokens tokens
  outside_edits reward_outside_edit if files other than the task's editable files were changed
  false_claim   reward_false_claim if the agent claims success but the tests deny it
The claim of success is a structured signal: `claimed`, the `success` argument of the agent's
`finish` call. Only callers without one (text-only agents, old transcripts) pass claimed=None, and
then the final message is read with the `claims_success` heuristic.
`length_weight` scales the length term per task (difficulty-aware effort: 1 on easy tasks, which
are rewarded for finishing fast, 0 on hard ones, which are not punished for thinking longer).
  tampering     reward_tampering if the grader found tampering (test framework, grader, interpreter
                startup or process exit manipulated; `composer_jax.env.tamper`); the base is then 0
Every component is reported on its own (`RewardBreakdown.as_dict`).
"""
from __future__ import annotations

import dataclasses
import math
import re

from composer_jax.env.config import EnvConfig


@dataclasses.dataclass(frozen=True)
class EffortCounts:
    """Real token counts of one episode, split by kind (a token-level agent fills it in):
    content_tokens: generated text outside tool calls (reasoning and content, not the final
    message); tool_call_tokens: generated tool-call sections; tool_output_tokens: tool results fed
    back to the policy; final_message_tokens: the closing message."""
    content_tokens: int = 0
    tool_call_tokens: int = 0
    tool_output_tokens: int = 0
    final_message_tokens: int = 0

    @property
    def generated_tokens(self) -> int:
        return self.content_tokens + self.tool_call_tokens + self.final_message_tokens


def effort(cfg: EnvConfig, *, num_calls: int, num_turns: int, num_tokens: int = 0,
           counts: EffortCounts | None = None) -> float:
    """The weighted effort x of an episode (module docstring); `counts` replaces `num_tokens`."""
    if counts is None:
        tokens = cfg.reward_length_token_weight * num_tokens
    else:
        tokens = (cfg.reward_length_token_weight * counts.content_tokens
                  + cfg.reward_length_tool_call_token_weight * counts.tool_call_tokens
                  + cfg.reward_length_tool_output_weight * counts.tool_output_tokens
                  + cfg.reward_length_final_weight * counts.final_message_tokens)
    return (tokens + cfg.reward_length_call_weight * num_calls
            + cfg.reward_length_turn_weight * num_turns)

_CLAIM = re.compile(r"\b(fixed|resolved|implemented|done|works|working|pass(es|ing)?|complete[d]?)\b",
                    re.IGNORECASE)
_DOUBT = re.compile(r"\b(not|n't|unable|couldn't|cannot|can't|fail(ed|s|ing)?|unsure|partially|give up|gave up)\b",
                    re.IGNORECASE)


def length_penalty(x: float, k: float, q: float) -> float:
    """C(x) = ((1 + k x)^(1 - q) - 1) / (k (1 - q)); the q -> 1 limit is ln(1 + k x) / k."""
    if x <= 0:
        return 0.0
    if abs(q - 1.0) < 1e-9:
        return math.log1p(k * x) / k
    return ((1.0 + k * x) ** (1.0 - q) - 1.0) / (k * (1.0 - q))


def claims_success(message: str) -> bool:
    """True if a final message asserts the work is done/working and does not hedge."""
    return bool(_CLAIM.search(message or "")) and not _DOUBT.search(message or "")


@dataclasses.dataclass(frozen=True)
class RewardBreakdown:
    resolved: float
    base: float
    invalid_calls: float
    length: float
    outside_edits: float
    false_claim: float
    total: float
    tampering: float = 0.0
    valid_calls: float = 0.0
    communication: float = 0.0
    effort: float = 0.0

    def as_dict(self) -> dict:
        return {f"reward_{k}": v for k, v in dataclasses.asdict(self).items()}


def compute_reward(*, resolved: bool, f2p_fraction: float, num_calls: int, num_invalid_calls: int,
                   num_tokens: int, num_turns: int, changed_files, editable_files,
                   final_message: str, cfg: EnvConfig, tampered: bool = False,
                   counts: EffortCounts | None = None, claimed: bool | None = None,
                   length_weight: float = 1.0) -> RewardBreakdown:
    """All reward components for one finished episode (see the module docstring).

    num_tokens: generated tokens (used for the effort only when `counts` is None); counts: real
    token counts split by kind; claimed: the agent's structured claim of success (None: read the
    final message with `claims_success`); length_weight: the task's scale of the length term.
    `effort` in the breakdown is x (not a reward term)."""
    if length_weight < 0:
        raise ValueError(f"length_weight must be >= 0, got {length_weight}")
    if tampered:
        resolved, f2p_fraction = False, 0.0
    base = 1.0 if resolved else cfg.reward_partial_credit * f2p_fraction
    invalid = min(cfg.reward_invalid_call_cap, cfg.reward_invalid_call * num_invalid_calls)
    num_valid = max(num_calls - num_invalid_calls, 0)
    valid = cfg.reward_valid_call * base * (num_valid / num_calls if num_calls else 0.0)
    x = effort(cfg, num_calls=num_calls, num_turns=num_turns, num_tokens=num_tokens, counts=counts)
    length = (length_weight * cfg.reward_length_coef
              * length_penalty(x, cfg.reward_length_k, cfg.reward_length_q))
    outside = set(changed_files) - set(editable_files)
    outside_pen = cfg.reward_outside_edit if outside else 0.0
    claim = claims_success(final_message) if claimed is None else bool(claimed)
    false_claim = cfg.reward_false_claim if (not resolved and claim) else 0.0
    tampering = cfg.reward_tampering if tampered else 0.0
    final_tokens = (counts.final_message_tokens if counts is not None
                    else max(1, len(final_message or "") // 4) if (final_message or "").strip() else 0)
    clear = (bool((final_message or "").strip()) and claim
             and final_tokens <= cfg.reward_communication_max_tokens)
    communication = cfg.reward_communication if (resolved and clear) else 0.0
    total = (base + valid + communication
             - invalid - length - outside_pen - false_claim - tampering)
    return RewardBreakdown(float(resolved), base, invalid, length, outside_pen, false_claim, total,
                           tampering=tampering, valid_calls=valid, communication=communication,
                           effort=x)
