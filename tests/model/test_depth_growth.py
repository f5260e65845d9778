"""Depth growth (composer_jax/model/depth_growth.py): a copied layer with zeroed residual writes
leaves the model's function unchanged, a scaled one changes it, and bad requests are refused."""

from __future__ import annotations

import json
import pathlib

import jax
import numpy as np
import pytest

from composer_jax.errors import CheckpointError
from composer_jax.model.depth_growth import grow_checkpoint
from composer_jax.model.hf import load_hf, save_hf

DATA = pathlib.Path(__file__).resolve().parent.parent / "hf_goldens" / "data"


def _logits(model, ids):
    out = model(jax.numpy.asarray(ids))
    mtp = [] if out.mtp_logits is None else list(np.asarray(out.mtp_logits))
    return np.asarray(out.logits), mtp


@pytest.mark.parametrize("name,at", [("base_with_mtp", 1), ("dense_prefix2_shared2", 0)])   # MoE + MTP; dense
def test_a_silent_copy_keeps_the_function_and_a_scaled_one_changes_it(name, at, tmp_path):
    golden = np.load(DATA / name / "golden.npz")
    cfg, model = load_hf(DATA / name)
    save_hf(model, tmp_path / "src")
    logits, mtp = _logits(model, golden["input_ids"])

    config = grow_checkpoint(tmp_path / "src", tmp_path / "silent", at, 0.0)
    grown_cfg, grown = load_hf(tmp_path / "silent")
    assert grown_cfg.num_layers == cfg.num_layers + 1 == config["num_hidden_layers"]
    assert grown_cfg.first_k_dense == cfg.first_k_dense + (at < cfg.first_k_dense)
    grown_logits, grown_mtp = _logits(grown, golden["input_ids"])
    np.testing.assert_allclose(grown_logits, logits, atol=1e-5 * np.abs(logits).max())
    assert len(grown_mtp) == len(mtp)
    for a, b in zip(grown_mtp, mtp):
        np.testing.assert_allclose(a, b, atol=1e-5 * np.abs(b).max())

    grow_checkpoint(tmp_path / "src", tmp_path / "scaled", at, 0.5)
    _, scaled = load_hf(tmp_path / "scaled")
    assert np.abs(_logits(scaled, golden["input_ids"])[0] - logits).max() > 1e-3 * np.abs(logits).max()


def test_bad_requests_are_refused(tmp_path):
    _, model = load_hf(DATA / "base")
    save_hf(model, tmp_path / "src")
    layers = json.loads((tmp_path / "src" / "config.json").read_text())["num_hidden_layers"]
    with pytest.raises(CheckpointError, match="cannot copy layer"):
        grow_checkpoint(tmp_path / "src", tmp_path / "out", layers, 0.0)
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        grow_checkpoint(DATA / "dense_prefix2_shared2", tmp_path / "out", 0, 0.0)
    (tmp_path / "taken").mkdir()
    with pytest.raises(CheckpointError, match="exists"):
        grow_checkpoint(tmp_path / "src", tmp_path / "taken", 0, 0.0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src", "taken"]   # nothing half-written left


def test_a_fresh_layer_is_random_at_the_copied_scale_and_silent_at_scale_zero(tmp_path):
    from safetensors.numpy import load_file

    golden = np.load(DATA / "dense_prefix2_shared2" / "golden.npz")
    _, model = load_hf(DATA / "dense_prefix2_shared2")
    save_hf(model, tmp_path / "src")
    logits, _ = _logits(model, golden["input_ids"])
    grow_checkpoint(tmp_path / "src", tmp_path / "fresh", 0, 0.0, fresh_seed=3)
    _, grown = load_hf(tmp_path / "fresh")
    np.testing.assert_allclose(_logits(grown, golden["input_ids"])[0], logits, atol=1e-5 * np.abs(logits).max())
    grow_checkpoint(tmp_path / "src", tmp_path / "fresh1", 0, 1.0, fresh_seed=3)
    grow_checkpoint(tmp_path / "src", tmp_path / "copy1", 0, 1.0)
    fresh, copy = load_file(tmp_path / "fresh1" / "model.safetensors"), load_file(tmp_path / "copy1" / "model.safetensors")
    new = [n for n in fresh if n.startswith("model.layers.1.")]
    assert new and sorted(new) == sorted(n for n in copy if n.startswith("model.layers.1."))
    for name in new:
        if name.endswith("norm.weight") or fresh[name].ndim < 2:
            np.testing.assert_array_equal(fresh[name], copy[name])            # norms and vectors copied
        else:
            assert not np.allclose(fresh[name], copy[name])
            np.testing.assert_allclose(fresh[name].std(), copy[name].std(), rtol=0.2)
    for name in fresh:                                                        # every other layer as it was
        if not name.startswith("model.layers.1."):
            np.testing.assert_array_equal(fresh[name], copy[name])
