"""The one reader of a run's checkpoints, whatever kind of run wrote them.

Every run that trains weights (pretraining / SFT: `train/loop.py`; RL: `rl/checkpoint.py`) writes
the same checkpoint format under WORKDIR/checkpoints/<step>/:

  state   a TrainState (params, buffers = router biases, opt_state, step, non-finite counters)
  meta    JSON: `model` (the architecture), `seed`, `kind` ("train" | "rl")
  data    pretraining / SFT only: the input iterator's state (JSON)
  rl      RL only: version, consumed rollout groups (JSON)

A consumer (eval, generate, `train.init_from`, HF export) names a run as `WORKDIR` (its newest
readable checkpoint) or `WORKDIR@STEP` (for an RL run the step is the policy version) and reads the
weights only: params and buffers are restored by name (Orbax partial restore), so the optimizer
the run used does not matter. RL checkpoints written before `meta` existed are read with the
architecture of the run's config.json.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import sys

from composer_jax.config import ModelConfig, from_dict, split_legacy_model
from composer_jax.errors import CheckpointError, ComposerError

CHECKPOINTS = "checkpoints"


def parse_run_source(source: str) -> tuple[pathlib.Path, int | None]:
    """("WORKDIR", None) or ("WORKDIR", STEP) from "WORKDIR" / "WORKDIR@STEP"."""
    text = str(source)
    head, sep, tail = text.rpartition("@")
    if sep and head and tail.isdigit():
        return pathlib.Path(head).expanduser(), int(tail)
    if sep and head and (pathlib.Path(head) / CHECKPOINTS).is_dir():
        raise ComposerError(f"{text!r}: the part after '@' must be a checkpoint step (an integer), "
                            f"e.g. {head}@{(checkpoint_steps(head) or [0])[-1]}")
    return pathlib.Path(text).expanduser(), None


def is_run_dir(path) -> bool:
    return (pathlib.Path(path) / CHECKPOINTS).is_dir()


def checkpoint_steps(run_dir) -> list[int]:
    """The committed checkpoint steps of a run, ascending (Orbax's temporary dirs are skipped)."""
    d = pathlib.Path(run_dir) / CHECKPOINTS
    if not d.is_dir():
        return []
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit() and (p / "state").is_dir())


def read_meta(run_dir, step: int) -> dict:
    """The `meta` item of a checkpoint step; for RL checkpoints without one, the model and seed of
    the run's config.json (`kind` "rl" when an `rl` item is there)."""
    step_dir = pathlib.Path(run_dir) / CHECKPOINTS / str(step)
    meta_file = step_dir / "meta" / "metadata"
    if meta_file.is_file():
        meta = json.loads(meta_file.read_text())
    else:
        cfg_file = pathlib.Path(run_dir) / "config.json"
        if not cfg_file.is_file():
            raise CheckpointError(f"checkpoint {step_dir} has no meta item and {run_dir} has no "
                                  f"config.json: the architecture of its weights is unknown")
        raw = json.loads(cfg_file.read_text())
        meta = {"model": raw["model"], "seed": raw.get("seed", 0)}
    meta.setdefault("kind", "rl" if (step_dir / "rl").is_dir() else "train")
    return meta


def model_config_of(run_dir, step: int):
    """The ModelConfig the checkpoint's weights belong to."""
    return from_dict(ModelConfig, split_legacy_model(read_meta(run_dir, step)["model"])[0])


def resolve_step(run_dir, step: int | None) -> list[int]:
    """The steps to try, newest first: [step] when given (an error naming the available ones if
    it is not there), else every committed step."""
    steps = checkpoint_steps(run_dir)
    if not steps:
        raise CheckpointError(f"{pathlib.Path(run_dir) / CHECKPOINTS} holds no checkpoint")
    if step is None:
        return steps[::-1]
    if step not in steps:
        raise CheckpointError(f"{run_dir} has no checkpoint at step {step}; it has {steps} "
                              f"(WORKDIR@STEP picks one, WORKDIR the newest)")
    return [step]


def _abstract_weights(state_dir: pathlib.Path):
    """ShapeDtypeStructs of the params and buffers stored in a checkpoint's `state` item."""
    import jax
    import orbax.checkpoint as ocp
    md = ocp.PyTreeCheckpointHandler().metadata(state_dir)
    tree = getattr(md, "tree", md)
    if not isinstance(tree, dict) or "params" not in tree:
        raise CheckpointError(f"{state_dir} does not hold a TrainState (no params)")
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                        {"params": tree["params"], "buffers": tree.get("buffers", {})})


def _check_shapes(stored, wanted, where: str) -> None:
    """A clear error when the consumer's model does not have the checkpoint's shapes."""
    import jax
    s = {jax.tree_util.keystr(k): v.shape for k, v in jax.tree_util.tree_leaves_with_path(stored)}
    w = {jax.tree_util.keystr(k): v.shape for k, v in jax.tree_util.tree_leaves_with_path(wanted)}
    diff = [f"{k}: checkpoint {s.get(k, 'missing')} vs model {w.get(k, 'missing')}"
            for k in sorted(set(s) | set(w)) if s.get(k) != w.get(k)]
    if diff:
        raise CheckpointError(
            f"{where} holds weights of another architecture than this run's model "
            f"({len(diff)} differing tensors, e.g. {'; '.join(diff[:3])}); set the model section "
            f"to the checkpoint's (its config.json `model`, e.g. --config=WORKDIR/config.json)")


def restore_weights(run_dir, step: int | None = None, template=None):
    """(params, buffers, step, meta) of a run's checkpoint (newest readable one, or `step`).

    template: optional pytree {"params": ..., "buffers": ...} of arrays or ShapeDtypeStructs with
    shardings (e.g. a TrainState's): the weights are restored straight into those shardings and
    must have its shapes. Without one, they come back as host numpy arrays in their stored dtype.
    An unreadable newest checkpoint falls back to the previous one, with a warning."""
    import jax
    import orbax.checkpoint as ocp
    run_dir = pathlib.Path(run_dir).expanduser().absolute()     # Orbax wants absolute paths
    errors = []
    for s in resolve_step(run_dir, step):
        state_dir = run_dir / CHECKPOINTS / str(s) / "state"
        try:
            meta = read_meta(run_dir, s)
            stored = _abstract_weights(state_dir)
        except Exception as e:  # noqa: BLE001  (unreadable: try the previous step)
            if isinstance(e, CheckpointError) and step is not None:
                raise
            errors.append(f"step {s}: {type(e).__name__}: {str(e)[:200]}")
            print(f"warning: checkpoint {state_dir.parent} is unreadable ({type(e).__name__}); "
                  f"trying the previous one", file=sys.stderr)
            continue
        if template is not None:
            wanted = jax.tree.map(ocp.utils.to_shape_dtype_struct,
                                  {"params": template["params"], "buffers": template["buffers"]})
            _check_shapes(stored, wanted, f"{run_dir}@{s}")
        else:
            wanted = stored
        handler = ocp.PyTreeCheckpointHandler()
        try:
            out = handler.restore(state_dir, args=ocp.args.PyTreeRestore(
                item=wanted, restore_args=ocp.checkpoint_utils.construct_restore_args(wanted),
                partial_restore=True))
        except Exception as e:  # noqa: BLE001
            errors.append(f"step {s}: {type(e).__name__}: {str(e)[:200]}")
            print(f"warning: checkpoint {state_dir.parent} is unreadable ({type(e).__name__}); "
                  f"trying the previous one", file=sys.stderr)
            continue
        finally:
            handler.close()
        return out["params"], out.get("buffers", {}), s, meta
    raise CheckpointError(f"no readable checkpoint in {run_dir / CHECKPOINTS}: " + "; ".join(errors))


def run_config(run_dir: pathlib.Path, cfg):
    """`cfg` with the model section and seed of the config a training run wrote to its workdir
    (only those: the weights' architecture; execution and other sections stay the consumer's).
    A config.json in the layout before the execution section is read too (its execution fields
    are left out: `composer_jax.config.split_legacy_model`)."""
    raw = json.loads((pathlib.Path(run_dir) / "config.json").read_text())
    arch, _ = split_legacy_model(raw["model"])
    return dataclasses.replace(cfg, model=from_dict(ModelConfig, arch),
                               seed=raw.get("seed", cfg.seed))
