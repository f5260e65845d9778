"""`train.init_from=RUN` is the initial policy of rl_async for every task family, or the run is
refused with the reason (never recorded in config.json and silently ignored)."""
import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from composer_jax.agent import lookup as lk
from composer_jax.config import Config, to_dict
from composer_jax.errors import ComposerError, ConfigError
from composer_jax.model import init_model
from composer_jax.rl.task_program import TaskProgram
from composer_jax.train.checkpoint import Checkpointer
from composer_jax.train.step import build
from experiments.rl import _lookup_config, prepare


def _rl_config(init_from: str = "") -> Config:
    cfg = _lookup_config(2)
    task = dataclasses.replace(cfg.rl.task, sft_steps=0, num_train_tasks=8, num_eval_tasks=8)
    return dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, task=task),
                               train=dataclasses.replace(cfg.train, init_from=init_from))


def _write_run(path, cfg: Config, seed: int, tokenizer) -> dict:
    """A run's workdir with one checkpoint of a fresh cfg.model (seed) and `tokenizer`; returns
    the checkpoint's parameters."""
    model = init_model(cfg.model, seed, cfg.execution, cfg.train.init_std)
    _, state = build(model, cfg, loss="lm")
    ck = Checkpointer(path / "checkpoints", cfg, every=1, keep=1)
    ck.save(0, state, {}, force=True)
    ck.close()
    tokenizer.save(path / "tokenizer.json")
    return state.params


def _flat(tree) -> list:
    return [np.asarray(x, np.float32) for x in jax.tree.leaves(tree)]


def test_rl_init_from_a_run_is_the_initial_policy(tmp_path):
    base = _rl_config()
    saved = _write_run(tmp_path / "run", base, seed=1234, tokenizer=lk.lookup_tokenizer(
        base.model.vocab_size))
    cfg = prepare(_rl_config(str(tmp_path / "run")))
    assert cfg.train.init_from == str(tmp_path / "run") and cfg.model == base.model
    program = TaskProgram(to_dict(cfg))
    _, params, _ = nnx.split(program.initial_model(), nnx.Param, ...)
    got = _flat(nnx.to_pure_dict(params))
    want = _flat(saved)
    assert len(got) == len(want)
    assert all(np.allclose(g, w) for g, w in zip(got, want))
    # without init_from the initial policy is the family's own (here the 0-step SFT policy)
    _, own, _ = nnx.split(TaskProgram(to_dict(prepare(_rl_config()))).initial_model(),
                          nnx.Param, ...)
    assert not all(np.allclose(g, w) for g, w in zip(_flat(nnx.to_pure_dict(own)), want))


def test_rl_init_from_refuses_what_it_cannot_start_from(tmp_path):
    base = _rl_config()
    _write_run(tmp_path / "other_tok", base, seed=1, tokenizer=lk.lookup_tokenizer(
        base.model.vocab_size + 64))
    with pytest.raises(ConfigError, match="tokenizer"):
        prepare(_rl_config(str(tmp_path / "other_tok")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ComposerError, match="neither a run"):
        prepare(_rl_config(str(tmp_path / "empty")))
