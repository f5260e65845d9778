"""Depth growth: a checkpoint with one more decoder layer, a copy of an existing one.

`insert_layer(tensors, hf_config, at, scale, fresh_seed=None)` inserts a copy of layer `at` right
after it; the copy's two residual writes (`self_attn.o_proj`, and the MLP's `down_proj` or every expert's and
shared expert's) are multiplied by `scale`. With `scale = 0` the grown model computes exactly what
the original did (the new layer adds nothing to the residual stream) yet its weights get gradients
through the scaled writes once `scale > 0`; a small `scale` starts it as a weak copy of a trained
layer (growing a 2-layer copy model this way let it learn a lookup by a key two ids back, which the
2-layer model did not: benchmarks/results/rl_coding_ladder.txt section 21). Layers above `at`, MTP layers included
(`model.layers.{num_hidden_layers + k}`), move up by one; `first_k_dense_replace` grows by one
when the copy is of a dense layer.

With `fresh_seed` the new layer is not a copy but a fresh one: each of its matrices is drawn from
a normal distribution with the copied tensor's standard deviation (norm weights and biases are
copied), so its attention starts unsaturated. A copy inherits the copied layer's attention
patterns, and a head that already puts all its weight on one token gets almost no gradient
towards any other (benchmarks/results/rl_coding_ladder.txt section 22).

`grow_checkpoint(src, dst, at, scale)` does it on an unsharded HF checkpoint directory (one
`model.safetensors`, the format `save_hf` writes for small models), copying its other files; the
whole checkpoint is held in host memory, so this is a tool for research-scale models. `dst` must not
exist; it appears whole or not at all (written beside it, then renamed).

    python -m composer_jax.model.depth_growth SRC DST --at 0 --scale 0.1 [--fresh_seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import sys
import tempfile

import numpy as np
from safetensors.numpy import load_file, save_file

from composer_jax.errors import CheckpointError

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_RESIDUAL_WRITES = re.compile(r"(self_attn\.o_proj|mlp\.(experts\.\d+\.|shared_experts\.)?down_proj)\.weight$")


def insert_layer(tensors: dict[str, np.ndarray], hf_config: dict, at: int, scale: float,
                 fresh_seed: int | None = None) -> tuple[dict[str, np.ndarray], dict]:
    """The tensors and config of the model with a copy of layer `at` inserted after it (its residual
    writes times `scale`; with `fresh_seed`, random matrices of the copied ones' scale instead, see
    the module doc). Pure: the inputs are not modified."""
    layers = hf_config.get("num_hidden_layers")
    if not isinstance(layers, int) or not 0 <= at < layers:
        raise CheckpointError(f"cannot copy layer {at}: the checkpoint has num_hidden_layers={layers!r} "
                              f"(copy one of 0..{layers - 1 if isinstance(layers, int) else '?'})")
    out: dict[str, np.ndarray] = {}
    copied = 0
    rng = np.random.default_rng(fresh_seed) if fresh_seed is not None else None
    for name, value in sorted(tensors.items()):
        match = _LAYER.match(name)
        if match is None:
            out[name] = value
            continue
        index, rest = int(match.group(1)), match.group(2)
        out[f"model.layers.{index + 1 if index > at else index}.{rest}"] = value
        if index == at:
            new = value
            if rng is not None and value.ndim >= 2 and "norm" not in rest:
                new = rng.normal(0.0, float(value.astype(np.float64).std()), value.shape).astype(value.dtype)
            out[f"model.layers.{at + 1}.{rest}"] = ((new * scale).astype(value.dtype)
                                                    if _RESIDUAL_WRITES.search(rest) else new)
            copied += 1
    if not copied:
        raise CheckpointError(f"layer {at} has no tensors (model.layers.{at}.*) in this checkpoint")
    config = dict(hf_config, num_hidden_layers=layers + 1)
    if at < config.get("first_k_dense_replace", 0):
        config["first_k_dense_replace"] += 1
    return out, config


def grow_checkpoint(src: str | pathlib.Path, dst: str | pathlib.Path, at: int, scale: float,
                    fresh_seed: int | None = None) -> dict:
    """Writes `dst` (a new directory): `src` with layer `at` copied after itself (or a fresh layer
    of its shapes, `fresh_seed`). Returns the new HF config."""
    src, dst = pathlib.Path(src), pathlib.Path(dst)
    weights = src / "model.safetensors"
    if not weights.is_file():
        raise CheckpointError(f"{src}: no model.safetensors (depth growth reads unsharded HF checkpoints only; "
                              "write one with composer_jax.model.hf.save_hf or benchmarks/copy_formation.py --save)")
    if dst.exists():
        raise CheckpointError(f"{dst} exists: pick a new directory for the grown checkpoint")
    hf_config = json.loads((src / "config.json").read_text())
    if "text_config" in hf_config:
        raise CheckpointError(f"{src}: a nested text_config (Kimi-K2.5 style) is not supported here")
    tensors, config = insert_layer(load_file(weights), hf_config, at, scale, fresh_seed)
    dst.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    try:
        for other in src.iterdir():
            if other.is_file() and other.name not in ("model.safetensors", "config.json"):
                shutil.copy2(other, staging / other.name)
        save_file(tensors, staging / "model.safetensors")
        (staging / "config.json").write_text(json.dumps(config, indent=2))
        os.rename(staging, dst)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return config


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src", help="HF checkpoint directory to grow")
    ap.add_argument("dst", help="where to write the grown checkpoint")
    ap.add_argument("--at", type=int, default=0, help="copy this layer (0-based); the copy goes right after it")
    ap.add_argument("--scale", type=float, default=0.1, help="factor on the copy's residual writes (0: no change)")
    ap.add_argument("--fresh_seed", type=int, default=None,
                    help="a fresh random layer of layer --at's shapes and scale instead of a copy (this seed)")
    a = ap.parse_args(argv)
    config = grow_checkpoint(a.src, a.dst, a.at, a.scale, a.fresh_seed)
    what = f"a fresh layer (seed {a.fresh_seed}) of layer {a.at}'s shapes" if a.fresh_seed is not None else f"layer {a.at} copied"
    print(f"{a.dst}: {config['num_hidden_layers']} layers ({what}, residual writes x {a.scale})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
