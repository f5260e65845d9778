"""Per-batch metrics of the trainer's rows: staleness, resolved rate, agent behaviour of
tool-using episodes (per difficulty level too), error rollouts, standard errors, weight-sync
sizes. numpy only (JAX only for other pytrees' sizes)."""
from __future__ import annotations

import numpy as np

from composer_jax.agent.rollout import Rollout


def staleness(rollout: Rollout, trainer_version: int) -> int | None:
    """Trainer version minus the oldest policy version that sampled a token of the rollout."""
    used = rollout.versions_used()
    return None if used is None else trainer_version - used[0]


def group_staleness(rollouts: list[Rollout], trainer_version: int) -> int:
    """The largest staleness of a group's rollouts (-1 when none sampled a token)."""
    return max((s for s in (staleness(r, trainer_version) for r in rollouts) if s is not None),
               default=-1)


def resolved_of(rollout: Rollout) -> float:
    """1.0 when the episode was graded resolved (reward component or info flag), else 0.0."""
    if "resolved" in rollout.reward:
        return float(rollout.reward["resolved"] > 0)
    return float(bool(rollout.info.get("resolved", False)))


BEHAVIOUR_TERMS = ("valid_calls", "invalid_calls", "length", "communication", "effort",
                   "outside_edits", "false_claim")
OUTCOMES = ("resolved", "finish_no_edit", "finish_wrong_edit", "no_finish_edited",
            "no_finish_no_edit", "error")


def outcome_class(rollout: Rollout) -> str | None:
    """What a coding episode (info with `changed_files`) came to, one of OUTCOMES: resolved;
    finished with no file changed (a claim with nothing done); finished after an edit that did not
    resolve; stopped without `finish` (turn or context limit) with or without an edit; error.
    None for episodes of families that edit no files."""
    if rollout.error is not None:
        return "error"
    if "changed_files" not in rollout.info:
        return None
    if resolved_of(rollout):
        return "resolved"
    edited = "edited" if rollout.info["changed_files"] else "no_edit"
    if rollout.info.get("stop_reason") == "finish":
        return "finish_wrong_edit" if edited == "edited" else "finish_no_edit"
    return f"no_finish_{edited}"


def is_tampered(rollout: Rollout) -> bool:
    """The grader flagged the episode as tampering (its reward carries the tampering term)."""
    return bool(rollout.reward.get("tampering", 0.0))


def outcome_metrics(rollouts: list[Rollout], prefix: str = "") -> dict:
    """`<prefix>outcome_<class>` counts (coding episodes; {} for other families) and
    `<prefix>tampered` (episodes the grader flagged)."""
    classes = [c for c in map(outcome_class, rollouts) if c is not None]
    if not classes:
        return {}
    out = {f"{prefix}outcome_{c}": float(classes.count(c)) for c in OUTCOMES}
    out[f"{prefix}tampered"] = float(sum(map(is_tampered, rollouts)))
    return out


def behaviour_metrics(rollouts: list[Rollout]) -> dict:
    """Per-batch agent behaviour of tool-using episodes (those whose info has `num_calls`):
    valid_call_rate (valid calls / calls, over the batch; absent when no call was made),
    tool_calls_mean, invalid_calls_mean, turns_mean, generated_tokens_mean, and the mean of each
    reward term (`reward_<term>_mean`: valid_calls, invalid_calls, length, communication, effort
    (the effort x, not a reward), outside_edits, false_claim). {} for other episodes (parity)."""
    eps = [r for r in rollouts if r.error is None and "num_calls" in r.info]
    if not eps:
        return {}
    calls = np.array([r.info["num_calls"] for r in eps], np.float64)
    invalid = np.array([r.info.get("num_invalid_calls", 0) for r in eps], np.float64)
    out = {"tool_calls_mean": float(calls.mean()), "invalid_calls_mean": float(invalid.mean()),
           "turns_mean": float(np.mean([r.info.get("num_turns", 0) for r in eps])),
           "generated_tokens_mean": float(np.mean([r.info.get("generated_tokens", 0)
                                                   for r in eps]))}
    if calls.sum() > 0:
        out["valid_call_rate"] = float((calls - invalid).clip(min=0).sum() / calls.sum())
    out.update(level_metrics(eps))
    if any("changed_files" in r.info for r in eps):
        out["tampered"] = float(sum(map(is_tampered, eps)))
    for term in BEHAVIOUR_TERMS:
        vals = [r.reward[term] for r in eps if term in r.reward]
        if vals:
            out[f"reward_{term}_mean"] = float(np.mean(vals))
    return out


def level_metrics(rollouts: list[Rollout], prefix: str = "") -> dict:
    """Per difficulty level (episodes whose info has `level`, e.g. the lookup family's easy/hard):
    `<prefix><level>_generated_tokens_mean`, `_resolved_rate` and `_count`."""
    levels: dict[str, list[Rollout]] = {}
    for r in rollouts:
        if r.error is None and "level" in r.info:
            levels.setdefault(str(r.info["level"]), []).append(r)
    out = {}
    for level, rs in sorted(levels.items()):
        out[f"{prefix}{level}_generated_tokens_mean"] = float(np.mean(
            [r.info.get("generated_tokens", 0) for r in rs]))
        out[f"{prefix}{level}_resolved_rate"] = float(np.mean([resolved_of(r) for r in rs]))
        out[f"{prefix}{level}_count"] = float(len(rs))
    return out


def standard_error(values) -> float:
    """The standard error of the mean of `values` (sample std / sqrt(n); 0 for n < 2)."""
    v = np.asarray(list(values), np.float64)
    return float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else 0.0


def error_metrics(rollouts: list[Rollout], penalty: float | None) -> dict:
    """error_penalised: error rollouts trained with reward -penalty (they have sampled tokens);
    error_excluded: error rollouts without a sampled token (nothing to train: left out, counted).
    With penalty None (a learner that excludes every error rollout) all count as excluded."""
    errs = [r for r in rollouts if r.error is not None]
    if penalty is None:
        return {"error_penalised": 0.0, "error_excluded": float(len(errs))}
    trainable = sum(r.num_trainable > 0 for r in errs)
    return {"error_penalised": float(trainable), "error_excluded": float(len(errs) - trainable)}


def sync_stats(info, params) -> dict:
    """weight_sync_bytes / weight_sync_ratio from what a store's publish returned (an object or
    dict: bytes sent as `bytes_sent` or `bytes`, full size as `full_bytes` or `raw_bytes`, e.g.
    rl.weights.PublishStats); the full size is measured from `params` if absent."""
    get = (lambda k: info.get(k)) if isinstance(info, dict) else (lambda k: getattr(info, k, None))
    sent = get("bytes_sent") or get("bytes") or get("nbytes")
    full = get("full_bytes") or get("raw_bytes")
    if full is None:
        full = tree_nbytes(params)
    if sent is None:
        return {}
    return {"weight_sync_bytes": float(sent),
            "weight_sync_ratio": float(full) / max(float(sent), 1.0)}


def tree_nbytes(tree) -> int:
    """Bytes of every array leaf of a nested dict/list/tuple (or a JAX pytree)."""
    if isinstance(tree, dict):
        return sum(tree_nbytes(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(tree_nbytes(v) for v in tree)
    if hasattr(tree, "nbytes"):
        return int(tree.nbytes)
    import jax.tree_util as jtu  # other pytrees (trainer side, JAX already loaded)
    leaves = jtu.tree_leaves(tree)
    return sum(int(getattr(x, "nbytes", 0)) for x in leaves if x is not tree)
