"""Config validation, presets and parameter counts, and CLI override errors."""
import dataclasses
import json
import pathlib
import subprocess
import sys

import pytest

from composer_jax.config import (Config, ModelConfig, MODEL_PRESETS, SECTION_PRESETS, from_dict,
                                 kimi_k2_5, to_dict)
from composer_jax.errors import ConfigError
from composer_jax.model import count_params
from composer_jax.overrides import apply_overrides

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("kwargs, needle", [
    (dict(num_experts_per_tok=9, num_routed_experts=8), "num_experts_per_tok"),
    (dict(n_group=3), "n_group=3 must be >= 1 and divide"),
    (dict(n_group=2, topk_group=3), "topk_group"),
    (dict(qk_rope_head_dim=7), "even"),
    (dict(q_lora_rank=-1), "0 = plain q projection"),
    (dict(first_k_dense=5, num_layers=2), "first_k_dense"),
])
def test_model_validation_messages(kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        ModelConfig(**kwargs)


def test_kimi_param_count_matches_reference():
    total, active = count_params(kimi_k2_5())
    # DESIGN.md: exact count 1.026T total, 32.86B active (embedding + head included); +-0.5%.
    assert abs(total / 1.026e12 - 1) < 0.005, total
    assert abs(active / 32.86e9 - 1) < 0.005, active
    # the announced round numbers, within 2%
    assert abs(total / 1.04e12 - 1) < 0.02 and abs(active / 32e9 - 1) < 0.03


def test_presets_build_and_count():
    for name, make in MODEL_PRESETS.items():
        total, active = count_params(make())
        assert 0 < active <= total, name


def test_config_json_round_trip():
    cfg = apply_overrides(Config(), ["model=small", "train.lr=3e-4", "model.rope.factor=4",
                                     "model.rope.scaling=yarn"], SECTION_PRESETS)
    again = from_dict(Config, json.loads(json.dumps(to_dict(cfg))))
    assert again == cfg
    # an enum field that was a bool before (data.sft_turn_windows): the old JSON and flag still load
    old = json.loads(json.dumps(to_dict(cfg)))
    old["data"]["sft_turn_windows"] = True
    assert from_dict(Config, old).data.sft_turn_windows.value == "all"
    assert apply_overrides(Config(), ["data.sft_turn_windows=false"], SECTION_PRESETS).data.sft_turn_windows.value == "none"


@pytest.mark.parametrize("override, needle", [
    ("train.nope=1", "valid keys at this level: train.steps"),
    ("nosection.x=1", "valid keys at this level"),
    ("train.lr=fast", "expected a float"),
    ("train.steps=1.5", "expected an int"),
    ("model.scoring=relu", "expected one of"),
    ("model=huge", "preset name"),
    ("model.num_experts_per_tok=100", "num_experts_per_tok"),
    ("train.lr", "key.path=value"),
    ("model.remat=full", "'model.remat' has moved to 'execution.remat'"),
    ("model.precision=mxfp8", "moved to 'execution.precision'"),
    ("model.seq_aux_loss_coef=0.1", "moved to 'train.seq_aux_loss_coef'"),
    ("execution.quant_bf16_last_blocks=3", "quant_bf16_last_blocks must be in"),
    ("execution.remat=everything", "expected one of"),
])
def test_override_errors(override, needle):
    with pytest.raises(ConfigError, match=needle):
        apply_overrides(Config(), [override], SECTION_PRESETS)


def _launch(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "launch.py", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def test_cli_errors_are_one_clear_message(tmp_path):
    r = _launch("--experiment=nope", f"--workdir={tmp_path}")
    assert r.returncode == 2 and "unknown experiment 'nope'" in r.stderr and "Traceback" not in r.stderr
    r = _launch("--experiment=model_check", f"--workdir={tmp_path}", "--set", "train.lr=abc")
    assert r.returncode == 2 and "expected a float" in r.stderr and "Traceback" not in r.stderr


def test_cli_list_and_dry_run(tmp_path):
    r = _launch("--experiment=list")
    assert r.returncode == 0 and "model_check" in r.stdout
    r = _launch("--experiment=model_check", f"--workdir={tmp_path}", "--dry_run",
                "--set", "model=kimi_k2_5")
    assert r.returncode == 0, r.stderr
    dry = json.loads((tmp_path / "dry_run.json").read_text())
    assert abs(dry["params_total"] / 1.026e12 - 1) < 0.005
    assert set(dry) >= {"params_total", "params_active", "flops_per_token", "mesh", "per_device_bytes"}
    assert set(dry["per_device_bytes"]) >= {"params", "optimizer", "activations", "total"}
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model"]["name"] == "kimi_k2_5"


def test_execution_section_and_legacy_layout_migration(tmp_path):
    """`execution` is its own section (--set, presets); a config.json or checkpoint meta in the
    layout before it (model.remat, model.param_dtype, model.init_std, ...) still loads."""
    from composer_jax.api import load_config
    from composer_jax.config import MOVED_MODEL_KEYS
    from composer_jax.train.checkpoint import saved_model_config
    from composer_jax.train.run_checkpoint import run_config
    cfg = apply_overrides(Config(), ["model=small", "execution=bf16", "execution.remat=full",
                                     "execution.attention_kv_block=64", "train.init_std=0.01",
                                     "train.router_bias_update_rate=0.002"], SECTION_PRESETS)
    assert (cfg.execution.param_dtype.value, cfg.execution.remat.value) == ("bfloat16", "full")
    assert "remat" not in to_dict(cfg.model)
    # the old layout: execution fields and three training coefficients inside "model"
    old = to_dict(cfg)
    old["model"].update(old.pop("execution"))
    for k in ("router_bias_update_rate", "seq_aux_loss_coef", "init_std"):
        old["model"][k] = old["train"].pop(k)
    assert set(old["model"]) >= set(MOVED_MODEL_KEYS)
    (tmp_path / "config.json").write_text(json.dumps(old))
    assert load_config(tmp_path / "config.json") == cfg
    assert saved_model_config(old["model"]) == cfg.model          # a checkpoint's meta
    assert run_config(tmp_path, Config()).model == cfg.model
    assert saved_model_config(dict(old["model"], hidden_size=32)) != cfg.model


def test_overrides_validate_once_at_the_end():
    from composer_jax.config import Config
    cfg = apply_overrides(Config(), ["train.steps=4", "train.warmup_steps=1"], SECTION_PRESETS)
    assert (cfg.train.steps, cfg.train.warmup_steps) == (4, 1)
    with pytest.raises(ConfigError, match="warmup_steps"):
        apply_overrides(Config(), ["train.steps=4", "train.warmup_steps=9"], SECTION_PRESETS)
