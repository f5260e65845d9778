"""Audit of an RL run directory: was any finished rollout lost or trained twice?

    audit_run(workdir, group_size) -> dict   (raises AuditError with the first violation)

Checks, from `rollouts/` (the log, admitted.jsonl, consumed.jsonl) and the newest checkpoint's
consumed groups when given:
- every rollout id appears in consumed.jsonl at most once, and every group at most once;
- every consumed group has exactly `group_size` rollouts, all present in the log, with the ids
  `<group>-s000 .. -s{G-1}` (so none was lost between the log and the trainer);
- no two log records share a rollout id (one file per id by construction) and every record's group
  was admitted;
- if `checkpoint_groups` is given: consumed.jsonl's groups equal it (the log agrees with the
  trainer state).
No JAX.
"""
from __future__ import annotations

import collections
import pathlib

from composer_jax.errors import ComposerError
from composer_jax.rl.stream import RolloutLog, rollout_id


class AuditError(ComposerError, AssertionError):
    """A run directory violates a rollout-accounting guarantee; the message says which."""


def audit_run(workdir, group_size: int, checkpoint_groups=None) -> dict:
    log = RolloutLog(pathlib.Path(workdir) / "rollouts")
    logged = log.scan()
    ids = collections.Counter(r.rollout_id for r in logged)
    dup = [i for i, n in ids.items() if n > 1]
    if dup:
        raise AuditError(f"rollout ids logged twice: {dup[:5]}")
    admitted = log.admitted()
    stray = sorted({r.group_id for r in logged} - set(admitted))
    if stray:
        raise AuditError(f"logged rollouts of groups never admitted: {stray[:5]}")
    rows = log.consumed_rows()
    versions = [r["version"] for r in rows]
    if versions != sorted(set(versions)):
        raise AuditError(f"consumed.jsonl versions repeat or go back: {versions}")
    consumed_ids = collections.Counter(i for r in rows for i in r["rollout_ids"])
    twice = [i for i, n in consumed_ids.items() if n > 1]
    if twice:
        raise AuditError(f"rollouts trained twice: {twice[:5]}")
    consumed_groups = collections.Counter(g for r in rows for g in r["groups"])
    if any(n > 1 for n in consumed_groups.values()):
        raise AuditError("a group was consumed twice")
    logged_ids = set(ids)
    for g in consumed_groups:
        want = {rollout_id(g, s) for s in range(group_size)}
        got = {i for i in consumed_ids if i.startswith(g + "-")}
        if got != want:
            raise AuditError(f"group {g} was trained with {sorted(got)}, expected {sorted(want)}")
        if not want <= logged_ids:
            raise AuditError(f"group {g} was trained on rollouts missing from the log: "
                             f"{sorted(want - logged_ids)}")
    if checkpoint_groups is not None and set(checkpoint_groups) != set(consumed_groups):
        raise AuditError(f"consumed.jsonl ({len(consumed_groups)} groups) disagrees with the "
                         f"checkpoint ({len(set(checkpoint_groups))} groups)")
    unconsumed = len(logged_ids) - sum(1 for i in logged_ids if i in consumed_ids)
    return {"logged": len(logged_ids), "consumed": len(consumed_ids),
            "consumed_groups": len(consumed_groups), "logged_unconsumed": unconsumed,
            "admitted_groups": len(admitted), "versions": len(rows)}
