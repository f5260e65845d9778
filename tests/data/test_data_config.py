"""DataConfig validation and the cache directory resolution."""

from __future__ import annotations

import dataclasses
import os

import pytest

from composer_jax.data.config import DataConfig, SplitPattern, TurnWindows, resolved_cache_dir
from composer_jax.errors import ConfigError


def test_defaults_are_valid_and_typed():
    cfg = DataConfig()
    for field in dataclasses.fields(cfg):
        assert isinstance(getattr(cfg, field.name), (int, float, str, bool, tuple)), field.name
    assert DataConfig(split_pattern="cl100k").split_pattern is SplitPattern.CL100K
    assert DataConfig(sft_turn_windows="edit_only").sft_turn_windows is TurnWindows.EDIT_ONLY
    # configs written while it was a bool still load, as what they meant
    assert DataConfig(sft_turn_windows=True).sft_turn_windows is TurnWindows.ALL
    assert DataConfig(sft_turn_windows=False).sft_turn_windows is TurnWindows.NONE


@pytest.mark.parametrize("field,value,message", [
    ("seq_len", 1, "data.seq_len=1: must be an integer >= 2"),
    ("global_batch_size", 0, "data.global_batch_size"),
    ("vocab_size", 100, "data.vocab_size=100"),
    ("validation_fraction", 1.0, r"data.validation_fraction=1.0: must be a number in \[0, 1\)"),
    ("near_dup_threshold", 0.0, "data.near_dup_threshold"),
    ("minhash_bands", 7, "must divide data.minhash_perms=128"),
    ("split_pattern", "gpt5", "valid values are"),
    ("source_roots", ["/tmp"], "tuple of directory paths"),
    ("tokenizer_path", "/nonexistent/tokenizer.json", "no such file"),
    ("max_files", True, "data.max_files"),
    ("sft_value_weight", 0.0, r"data.sft_value_weight=0.0: must be a number in \(0, 1000\]"),
    ("sft_value_weight", True, "data.sft_value_weight"),
    ("sft_window_renames", -1, "data.sft_window_renames=-1: must be an integer >= 0"),
    ("sft_window_context", -1, "data.sft_window_context=-1: must be an integer >= 0"),
    ("sft_window_context", 2, "data.sft_turn_windows=none makes none"),
    ("sft_window_renames", 3, "data.sft_turn_windows=none makes none"),
    ("sft_turn_windows", "edits", r"data.sft_turn_windows='edits': valid values are \['none', 'all', 'edit_only', 'edit_tails',"
                         r" 'episodes_and_edit_tails'\]"),
])
def test_invalid_values_name_the_field(field, value, message):
    with pytest.raises(ConfigError, match=message):
        DataConfig(**{field: value})


def test_cache_dir_resolution(monkeypatch, tmp_path):
    monkeypatch.setenv("COMPOSER_JAX_CACHE", str(tmp_path / "env"))
    assert resolved_cache_dir(DataConfig()) == str(tmp_path / "env")
    assert resolved_cache_dir(DataConfig(cache_dir=str(tmp_path / "cfg"))) == str(tmp_path / "cfg")
    monkeypatch.delenv("COMPOSER_JAX_CACHE")
    assert resolved_cache_dir(DataConfig()) == os.path.expanduser("~/.cache/composer_jax")
