"""Where weights come from, for every consumer (training, generation, RL): one function.

`load_weights(source, cfg)` reads any of
  ""                       a fresh model initialised from `cfg.seed`
  a run's workdir          its newest readable Orbax checkpoint (parameters and router biases),
                           pretraining, SFT and RL runs alike (`composer_jax.train.run_checkpoint`:
                           the checkpoint's meta, or the run's config.json, gives the architecture)
  WORKDIR@STEP             that checkpoint step of a run (an RL run's steps are policy versions)
  a Hugging Face directory config.json + *.safetensors (`composer_jax.model.hf.load_hf`)
and returns `Weights`: pure parameter/buffer dicts plus where they came from. With `template` (a
TrainState placed on a mesh) a run's checkpoint is restored straight into the template's
shardings, so no host ever holds the whole model.
"""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import jax.numpy as jnp
from flax import nnx

from composer_jax.config import ModelConfig, from_dict, split_legacy_model
from composer_jax.errors import ComposerError
from composer_jax.model import abstract_model
from composer_jax.model.hf import load_hf
from composer_jax.train.run_checkpoint import (is_run_dir, parse_run_source, restore_weights,
                                               run_config)
from composer_jax.train.step import cast_params, fresh_model, merge_model


@dataclasses.dataclass
class Weights:
    """kind: "fresh" | "run" | "hf"; model_cfg: the architecture the weights belong to;
    execution: how the consumer computes them (its `cfg.execution`); params / buffers: pure dicts
    (parameters in the dtype they were stored in); step: the checkpoint's step (runs only);
    tokenizer_path: the run's tokenizer.json when it has one."""
    kind: str
    model_cfg: Any
    execution: Any
    params: dict
    buffers: dict
    step: int | None = None
    tokenizer_path: pathlib.Path | None = None

    def model(self, dtype=None):
        """The weights as an nnx Transformer computed as `execution` (parameters cast to
        `dtype`, default execution.param_dtype)."""
        graphdef, p, b = nnx.split(abstract_model(self.model_cfg, self.execution), nnx.Param, ...)
        dtype = jnp.dtype(dtype or self.execution.param_dtype.value)
        return merge_model(graphdef, p, b, cast_params(self.params, dtype), self.buffers)


def source_kind(source: str) -> str:
    """"fresh" (empty), "run" (a directory with checkpoints/, or WORKDIR@STEP) or "hf"
    (config.json and *.safetensors); anything else is an error that says what is expected."""
    if not source:
        return "fresh"
    path, step = parse_run_source(source)
    if is_run_dir(path):
        return "run"
    if (path / "config.json").exists() and list(path.glob("*.safetensors")):
        return "hf"
    raise ComposerError(f"weights source {source!r} is neither a run's workdir (with checkpoints/; "
                        f"WORKDIR@STEP for one checkpoint) nor a Hugging Face checkpoint directory "
                        f"(config.json + *.safetensors); use '' for a fresh model")


def load_weights(source: str, cfg, template=None) -> Weights:
    """Weights from `source` ("" fresh, a run workdir, an HF directory; see the module docstring).

    cfg: the consumer's Config (the fresh init's architecture and seed, the HF load's dtype).
    template: a TrainState whose params/buffers give the shapes and shardings to restore a run's
    checkpoint into (its optimizer state is ignored); None: host arrays in the stored dtype.
    """
    kind = source_kind(source)
    if kind == "fresh":
        _, p, b = nnx.split(fresh_model(cfg), nnx.Param, ...)
        return Weights("fresh", cfg.model, cfg.execution, nnx.to_pure_dict(p),
                       nnx.to_pure_dict(b))
    if kind == "hf":
        hf_cfg, model = load_hf(source, execution=cfg.execution)
        _, p, b = nnx.split(model, nnx.Param, ...)
        return Weights("hf", hf_cfg, cfg.execution, nnx.to_pure_dict(p), nnx.to_pure_dict(b))
    run_dir, step = parse_run_source(source)
    rcfg = run_config(run_dir, cfg) if (run_dir / "config.json").exists() else cfg
    shapes = None if template is None else {"params": template.params, "buffers": template.buffers}
    params, buffers, step, meta = restore_weights(run_dir, step, shapes)
    if "model" in meta:               # the checkpoint's own record of its architecture
        rcfg = dataclasses.replace(rcfg, model=from_dict(ModelConfig,
                                                         split_legacy_model(meta["model"])[0]))
    tok = run_dir / "tokenizer.json"
    return Weights("run", rcfg.model, rcfg.execution, params, buffers, step,
                   tok if tok.exists() else None)
