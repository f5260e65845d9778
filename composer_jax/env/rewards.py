"""Episode reward: resolved (SWE-bench rules) plus behaviour and quality terms, minus effort.

  total = base - invalid_calls - length - outside_edits - false_claim
  base          1 if resolved, else reward_partial_credit * (fraction of FAIL_TO_PASS passing)
  invalid_calls reward_invalid_call per malformed/failed call, capped at reward_invalid_call_cap
                (an invalid call also counts as a call in the effort, so it never pays better
                than a valid one)
  length        reward_length_coef * C(x), C(x) = ((1 + k x)^(1-q) - 1) / (k (1-q))  (concave;
                -> ln(1 + k x) / k as q -> 1), x = w_tok * tokens + w_call * calls + w_turn * turns
  outside_edits reward_outside_edit if files other than the task's editable files were changed
  false_claim   reward_false_claim if the final message claims success but the tests deny it
Every component is reported on its own (`RewardBreakdown.as_dict`).
"""
from __future__ import annotations

import dataclasses
import math
import re

from composer_jax.env.config import EnvConfig

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

    def as_dict(self) -> dict:
        return {f"reward_{k}": v for k, v in dataclasses.asdict(self).items()}


def compute_reward(*, resolved: bool, f2p_fraction: float, num_calls: int, num_invalid_calls: int,
                   num_tokens: int, num_turns: int, changed_files, editable_files,
                   final_message: str, cfg: EnvConfig) -> RewardBreakdown:
    """All reward components for one finished episode (see the module docstring)."""
    base = 1.0 if resolved else cfg.reward_partial_credit * f2p_fraction
    invalid = min(cfg.reward_invalid_call_cap, cfg.reward_invalid_call * num_invalid_calls)
    x = (cfg.reward_length_token_weight * num_tokens + cfg.reward_length_call_weight * num_calls
         + cfg.reward_length_turn_weight * num_turns)
    length = cfg.reward_length_coef * length_penalty(x, cfg.reward_length_k, cfg.reward_length_q)
    outside = set(changed_files) - set(editable_files)
    outside_pen = cfg.reward_outside_edit if outside else 0.0
    false_claim = cfg.reward_false_claim if (not resolved and claims_success(final_message)) else 0.0
    total = base - invalid - length - outside_pen - false_claim
    return RewardBreakdown(float(resolved), base, invalid, length, outside_pen, false_claim, total)
