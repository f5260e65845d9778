"""The initial policy of an RL run, the same for every task family:

  train.init_from=RUN   a pretraining, SFT or RL run's workdir (its newest checkpoint) or RUN@STEP:
                        its weights, with its architecture as the run's model
  else                  the family's own (`TaskFamily.initial_model`: the lookup SFT policy, the
                        coding family's rl.task.init_from), or a fresh `cfg.model` from `cfg.seed`
                        when the family has none

`resolve_init_from` runs once, in the driver, before anything is built: it takes the run's
architecture and refuses, with the reason, a source an RL run cannot start from (not a run's
checkpoint; a tokenizer other than the one the family's prompts are written in).
`initial_model` builds the policy (JAX: trainer and inference side only).
"""
from __future__ import annotations

import dataclasses
import json

from composer_jax.errors import ConfigError
from composer_jax.model import init_model
from composer_jax.train.run_checkpoint import model_config_of, parse_run_source, resolve_step
from composer_jax.train.weights import load_weights, source_kind


def resolve_init_from(cfg, family_cls):
    """`cfg` with the model of the `train.init_from` run (unchanged when it is ""); a ConfigError
    when RL cannot start from it (module docstring). `family_cls`: the run's task family class."""
    source = cfg.train.init_from
    if not source:
        return cfg
    what = f"train.init_from={source!r}"
    kind = source_kind(source)
    if kind != "run":
        raise ConfigError(f"{what} is a {kind} checkpoint: an RL run starts from a run's workdir "
                          f"(a pretraining, SFT or RL run; WORKDIR@STEP for one checkpoint)")
    run_dir, step = parse_run_source(source)
    model = model_config_of(run_dir, resolve_step(run_dir, step)[0])
    cfg = dataclasses.replace(cfg, model=model)
    run_tok = run_dir / "tokenizer.json"
    family_tok = family_cls(cfg).tokenizer()
    if not run_tok.is_file():
        raise ConfigError(f"{what}: {run_dir} has no tokenizer.json, so nothing says its weights "
                          f"read the prompts of rl.task={cfg.rl.task.family}")
    if json.loads(run_tok.read_text()) != json.loads(family_tok.hf.to_str()):
        raise ConfigError(f"{what}: the run's tokenizer ({run_tok}) is not the one the prompts of "
                          f"rl.task={cfg.rl.task.family} are written in; start from a run trained "
                          f"with that tokenizer (e.g. an earlier RL run of this task family)")
    return cfg


def initial_model(cfg, family):
    """The run's initial policy as an nnx model (module docstring)."""
    if cfg.train.init_from:
        return load_weights(cfg.train.init_from, cfg).model()
    model = family.initial_model()
    if model is None:
        model = init_model(cfg.model, cfg.seed, cfg.execution, cfg.train.init_std)
    return model

