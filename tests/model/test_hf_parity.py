"""Parity of our model with Hugging Face transformers' DeepseekV3ForCausalLM (goldens in
tests/hf_goldens/data, produced by tests/hf_goldens/make_goldens.py; torch is not needed here)."""
import pathlib

import jax
import numpy as np
import pytest

from composer_jax.model.hf import load_hf, save_hf

DATA = pathlib.Path(__file__).resolve().parents[1] / "hf_goldens" / "data"
CONFIGS = sorted(p.name for p in DATA.iterdir() if (p / "golden.npz").exists())


def test_goldens_present():
    assert len(CONFIGS) >= 6, CONFIGS


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_match_transformers(name):
    golden = np.load(DATA / name / "golden.npz")
    cfg, model = load_hf(DATA / name)
    out = model(jax.numpy.asarray(golden["input_ids"]))
    ours = np.asarray(out.logits)
    ref = golden["logits"]
    assert ours.shape == ref.shape
    err = np.max(np.abs(ours - ref))
    assert err <= 1e-4 * np.max(np.abs(ref)), f"{name}: max |dlogits| {err}"
    # The routing itself must agree, not only the logits.
    if out.router_indices is not None and "topk_idx" in golden:
        first_moe = cfg.first_k_dense
        layers = list(golden["router_layers"])
        for j, layer in enumerate(layers):
            ours_idx = np.sort(np.asarray(out.router_indices[layer - first_moe]).reshape(
                -1, cfg.num_experts_per_tok), -1)
            ref_idx = np.sort(golden["topk_idx"][j], -1)
            assert np.array_equal(ours_idx, ref_idx), f"{name}: routing differs at layer {layer}"


def test_mtp_layers_load():
    cfg, model = load_hf(DATA / "base_with_mtp")
    assert cfg.mtp_depth == 1
    golden = np.load(DATA / "base_with_mtp" / "golden.npz")
    out = model(jax.numpy.asarray(golden["input_ids"]))
    assert out.mtp_logits.shape == (1,) + golden["logits"].shape
    assert np.max(np.abs(np.asarray(out.logits) - golden["logits"])) <= 1e-4 * np.abs(
        golden["logits"]).max()


@pytest.mark.parametrize("name", ["base_with_mtp", "grouped", "dense_prefix2_shared2"])
def test_save_load_roundtrip_exact(name, tmp_path):
    cfg, model = load_hf(DATA / name)
    save_hf(model, tmp_path / "a", max_shard_bytes=40_000)   # forces a sharded save + index
    assert (tmp_path / "a" / "model.safetensors.index.json").exists()
    cfg2, model2 = load_hf(tmp_path / "a")
    assert cfg2 == cfg
    s1 = jax.tree.leaves(jax.tree.map(np.asarray, __import__("flax").nnx.state(model)))
    s2 = jax.tree.leaves(jax.tree.map(np.asarray, __import__("flax").nnx.state(model2)))
    assert len(s1) == len(s2)
    for a, b in zip(s1, s2):
        assert a.dtype == b.dtype and np.array_equal(a, b)
