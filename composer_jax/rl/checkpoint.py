"""Orbax checkpoints of an RL run: the learner's state plus which groups it has consumed.

Each checkpoint step (= trainer version) holds two items written together (Orbax writes a step
into a temporary directory and renames it when complete): `state` (the learner's pytree) and `rl`
(JSON: `version`, `consumed_groups`, `started_groups`, `totals`,
`dropped_groups`: how many consumed groups were dropped as too stale), and `meta` (JSON: the model
config, seed and kind "rl", as pretraining checkpoints record them), so every consumer of a run's
weights reads RL checkpoints like any other (`composer_jax.train.run_checkpoint`). Restoring gives back exactly the set of
groups whose rollouts are inside the restored weights, so a restart re-admits every other finished
rollout and trains none twice. Saves are synchronous: the consumed set must be durable before the
trainer moves on.
"""
from __future__ import annotations

import pathlib
import sys

from composer_jax.errors import CheckpointError


class RLCheckpointer:
    def __init__(self, directory, keep: int = 2, meta: dict | None = None,
                 keep_period: int | None = None):
        """keep: the newest checkpoints kept; keep_period: also keep every version that is a
        multiple of it (the evaluated versions, so `eval.policy=WORKDIR@V` can score them)."""
        import orbax.checkpoint as ocp
        self._ocp = ocp
        self.directory = pathlib.Path(directory).absolute()
        self.meta = {**(meta or {}), "kind": "rl"}
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=False,
                                                 cleanup_tmp_directories=True,
                                                 keep_period=keep_period or None),
            item_names=("state", "rl", "meta"))

    def save(self, version: int, state, consumed_groups, started_groups: int = 0,
             totals: dict | None = None, dropped_groups: int = 0) -> None:
        """totals: the run's running totals up to this version (elapsed time, rollouts and tokens
        trained, staleness histogram), so a resumed run's summary covers the whole run."""
        ocp = self._ocp
        meta = {"version": int(version), "consumed_groups": sorted(consumed_groups),
                "started_groups": int(started_groups), "totals": dict(totals or {}),
                "dropped_groups": int(dropped_groups)}
        self.manager.save(version, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), rl=ocp.args.JsonSave(meta),
            meta=ocp.args.JsonSave({**self.meta, "version": int(version)})), force=True)
        self.manager.wait_until_finished()

    def restore_latest(self, template):
        """(state, meta) of the newest readable checkpoint, or None if there is none. A corrupted
        newest checkpoint falls back to the previous one, with a warning."""
        import jax
        ocp = self._ocp
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
        steps = sorted(self.manager.all_steps(), reverse=True)
        errors = []
        for step in steps:
            try:
                out = self.manager.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract), rl=ocp.args.JsonRestore()))
                return out["state"], out["rl"]
            except Exception as e:  # noqa: BLE001  (any unreadable step: try the previous one)
                errors.append(f"step {step}: {type(e).__name__}: {str(e)[:200]}")
                print(f"warning: RL checkpoint {step} in {self.directory} is unreadable; trying "
                      f"the previous one", file=sys.stderr)
        if steps:
            raise CheckpointError(f"no readable RL checkpoint in {self.directory}: "
                                  + "; ".join(errors))
        return None

    def restore(self, step: int, template):
        """The trainer state of checkpoint `step` (e.g. 0, the starting policy)."""
        import jax
        ocp = self._ocp
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
        out = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract)))
        return out["state"]

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
