"""Orbax checkpoints of the whole training state: asynchronous, atomic, keep-last-K, resumable.

A checkpoint step holds three items: `state` (TrainState: params, router biases, optimizer state,
step, non-finite counters), `data` (the input iterator's state, JSON) and `meta` (the model config
and the run's seed, JSON). A restore checks that the model section (the architecture: what the
weights mean) is the one of the checkpoint and nothing else, so a run may resume with another
`execution` (remat, precision, kernels, dtypes) or other training settings. Orbax writes each step into a temporary directory and renames it when
complete, so a crash mid-save never leaves a half-written "latest" checkpoint. If the latest
checkpoint cannot be read, restore falls back to the previous one and says so.
"""
from __future__ import annotations

import sys
import time

import jax
import orbax.checkpoint as ocp

from composer_jax.config import Config, ModelConfig, from_dict, split_legacy_model, to_dict
from composer_jax.errors import CheckpointError
from composer_jax.runlog import run_path


def saved_model_config(saved: dict) -> ModelConfig | None:
    """The ModelConfig a checkpoint's meta recorded, or None when it cannot be read. Checkpoints
    written before the `execution` section existed recorded execution fields (remat, precision,
    ...) in the model section: they are left out (`composer_jax.config.split_legacy_model`); keys
    the checkpoint predates take their defaults (configs only ever gain fields with defaults)."""
    try:
        return from_dict(ModelConfig, split_legacy_model(saved)[0])
    except Exception:  # noqa: BLE001  (an unknown or invalid field: not a model we can compare)
        return None


class Checkpointer:
    def __init__(self, directory, cfg: Config, every: int, keep: int):
        self.directory = run_path(directory)     # a URL (gs://...) is used as given
        self.cfg = cfg
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, save_interval_steps=every,
                                                 enable_async_checkpointing=True,
                                                 cleanup_tmp_directories=True),
            item_names=("state", "data", "meta"))

    def _meta(self) -> dict:
        return {"model": to_dict(self.cfg.model), "seed": self.cfg.seed, "kind": "train"}

    def save(self, step: int, state, data_state: dict, force: bool = False) -> bool:
        """Starts an asynchronous save (if due or forced); returns whether one started."""
        return self.manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state),
            meta=ocp.args.JsonSave(self._meta())), force=force)

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def restore_latest(self, template, check_config: bool = True):
        """(state, data_state, step) from the newest readable checkpoint, or None if there is none.

        template: a TrainState of the right structure (arrays or ShapeDtypeStructs).
        """
        steps = sorted(self.manager.all_steps(), reverse=True)
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
        errors = []
        for step in steps:
            try:
                meta = self.manager.restore(step, args=ocp.args.Composite(
                    meta=ocp.args.JsonRestore()))["meta"]
            except Exception as e:  # noqa: BLE001  (any unreadable checkpoint: try the previous)
                errors.append(f"step {step}: {type(e).__name__}: {e}")
                print(f"warning: checkpoint step {step} in {self.directory} is unreadable "
                      f"({type(e).__name__}); falling back to the previous one", file=sys.stderr)
                continue
            then_cfg = saved_model_config(meta.get("model", {}))
            if check_config and then_cfg != self.cfg.model:
                now = to_dict(self.cfg.model)
                then = (to_dict(then_cfg) if then_cfg is not None
                        else split_legacy_model(meta.get("model", {}))[0])
                diff = {k: (then.get(k, "<missing>"), now.get(k, "<unknown>"))
                        for k in sorted(set(now) | set(then)) if then.get(k) != now.get(k)}
                raise CheckpointError(
                    f"checkpoint step {step} in {self.directory} was written by a different model "
                    f"config (checkpoint vs now: {diff}); use another --workdir or the same config")
            try:
                out = self.manager.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract), data=ocp.args.JsonRestore()))
            except Exception as e:  # noqa: BLE001
                errors.append(f"step {step}: {type(e).__name__}: {e}")
                print(f"warning: checkpoint step {step} in {self.directory} is unreadable "
                      f"({type(e).__name__}: {str(e)[:200]}); falling back to the previous one",
                      file=sys.stderr)
                continue
            self._set_aside([s for s in steps if s > step])
            return out["state"], out["data"], step
        if steps:
            raise CheckpointError(f"no readable checkpoint in {self.directory}: " + "; ".join(errors))
        return None

    def _set_aside(self, bad_steps: list[int]) -> None:
        """Moves unreadable checkpoints out of the manager's way (kept for inspection, not
        deleted), so the resumed run can write those steps again."""
        if not bad_steps:
            return
        aside = self.directory.parent / "checkpoints_unreadable"
        aside.mkdir(exist_ok=True)
        for step in bad_steps:
            for path in self.directory.iterdir():
                if path.name == str(step):
                    target = aside / f"{path.name}-{int(time.time())}"
                    path.rename(target)
                    print(f"warning: moved unreadable checkpoint {path} to {target}",
                          file=sys.stderr)
        self.manager.reload()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
