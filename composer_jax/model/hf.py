"""Hugging Face checkpoint I/O for DeepseekV3 / Kimi-K2 text models.

`load_hf(directory) -> (ModelConfig, Transformer)` reads config.json (a Kimi-K2.5 style nested
`text_config` is understood) and safetensors files, sharded (`model.safetensors.index.json`) or not,
including MTP layers (`model.layers.{num_hidden_layers + k}` with enorm/hnorm/eh_proj/shared_head).
`save_hf(model, directory)` writes a checkpoint `transformers` loads as DeepseekV3ForCausalLM.

Tensors stream one at a time: each model parameter is assembled from its checkpoint tensors
(layers x experts) through `jax.make_array_from_callback`, so with a sharding only the slices a
device owns are read, and host memory never holds more than one checkpoint tensor plus one
parameter shard. Missing, unexpected and mis-shaped tensors and unsupported config fields are
reported together in one `CheckpointError`.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import tempfile
from typing import Callable

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from composer_jax.config import (DType, ExecutionConfig, ModelConfig, RopeConfig, RopeScaling,
                                 ScoringFunc)
from composer_jax.errors import CheckpointError
from composer_jax.model.params import abstract_model
from composer_jax.model.transformer import Transformer

# ------------------------------------------------------------------------------------------------
# config.json <-> ModelConfig
# ------------------------------------------------------------------------------------------------


def _check_supported(hf: dict) -> list[str]:
    problems = []
    if hf.get("moe_layer_freq", 1) != 1:
        problems.append(f"moe_layer_freq={hf['moe_layer_freq']} (only 1 is supported)")
    if hf.get("topk_method", "noaux_tc") not in ("noaux_tc", "greedy", "group_limited_greedy"):
        problems.append(f"topk_method={hf['topk_method']!r} (supported: noaux_tc, greedy, "
                        f"group_limited_greedy)")
    if hf.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act={hf['hidden_act']!r} (only silu)")
    if hf.get("attention_bias", False):
        problems.append("attention_bias=true (MLA projections here have no biases)")
    if hf.get("tie_word_embeddings", False):
        problems.append("tie_word_embeddings=true (the head is untied in this architecture)")
    return problems


def _rope_from_hf(hf: dict) -> RopeConfig:
    rs = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    theta = float(hf.get("rope_theta", rs.get("rope_theta", 10000.0)))
    interleaved = bool(hf.get("rope_interleave", True))
    if kind in ("default", None) or not rs or "factor" not in rs:
        return RopeConfig(theta=theta, interleaved=interleaved)
    if kind != "yarn":
        raise CheckpointError(f"unsupported rope_scaling type {kind!r}; supported: yarn or none")
    return RopeConfig(
        theta=theta, scaling=RopeScaling.YARN, factor=float(rs["factor"]),
        original_max_position=int(rs.get("original_max_position_embeddings",
                                         hf.get("max_position_embeddings", 4096))),
        beta_fast=float(rs.get("beta_fast") or 32.0), beta_slow=float(rs.get("beta_slow") or 1.0),
        mscale=float(rs.get("mscale") or 0.0), mscale_all_dim=float(rs.get("mscale_all_dim") or 0.0),
        interleaved=interleaved)


def config_from_hf(hf: dict) -> ModelConfig:
    """ModelConfig from a HF DeepseekV3 / Kimi-K2 config.json dict."""
    if "text_config" in hf:          # Kimi K2.5 (multimodal wrapper): the text model's config
        hf = hf["text_config"]
    problems = _check_supported(hf)
    if problems:
        raise CheckpointError("unsupported config.json fields: " + "; ".join(problems))
    scoring = hf.get("scoring_func", "sigmoid")
    if scoring not in ("sigmoid", "softmax"):
        raise CheckpointError(f"unsupported scoring_func {scoring!r}; supported: sigmoid, softmax")
    try:
        return ModelConfig(
            name=hf.get("model_type", "deepseek_v3"), vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
            first_k_dense=hf.get("first_k_dense_replace", 0),
            dense_intermediate_size=hf["intermediate_size"],
            moe_intermediate_size=hf["moe_intermediate_size"],
            num_routed_experts=hf["n_routed_experts"], num_shared_experts=hf.get("n_shared_experts") or 0,
            num_experts_per_tok=hf["num_experts_per_tok"], n_group=hf.get("n_group") or 1,
            topk_group=hf.get("topk_group") or 1,
            routed_scaling_factor=float(hf.get("routed_scaling_factor", 1.0)),
            scoring=ScoringFunc(scoring), norm_topk_prob=bool(hf.get("norm_topk_prob", True)),
            num_heads=hf["num_attention_heads"], q_lora_rank=hf.get("q_lora_rank") or 0,
            kv_lora_rank=hf["kv_lora_rank"], qk_nope_head_dim=hf["qk_nope_head_dim"],
            qk_rope_head_dim=hf["qk_rope_head_dim"], v_head_dim=hf["v_head_dim"],
            rope=_rope_from_hf(hf), max_position_embeddings=hf.get("max_position_embeddings", 4096),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            mtp_depth=hf.get("num_nextn_predict_layers", 0) or 0)
    except KeyError as e:
        raise CheckpointError(f"config.json lacks the required key {e.args[0]!r}") from None


def dtype_from_hf(hf: dict) -> DType:
    """The checkpoint's stored dtype (torch_dtype): bfloat16, else float32."""
    hf = hf.get("text_config", hf)
    dtype = str(hf.get("torch_dtype", hf.get("dtype", "float32"))).replace("torch.", "")
    return DType.BFLOAT16 if dtype == "bfloat16" else DType.FLOAT32


def config_to_hf(cfg: ModelConfig, dtype: DType = DType.FLOAT32) -> dict:
    """A DeepseekV3 config.json dict for `cfg` whose tensors are stored in `dtype`."""
    rope_scaling = None
    if cfg.rope.scaling == RopeScaling.YARN:
        rope_scaling = {"type": "yarn", "rope_type": "yarn", "factor": cfg.rope.factor,
                        "original_max_position_embeddings": cfg.rope.original_max_position,
                        "beta_fast": cfg.rope.beta_fast, "beta_slow": cfg.rope.beta_slow,
                        "mscale": cfg.rope.mscale, "mscale_all_dim": cfg.rope.mscale_all_dim}
    return {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.dense_intermediate_size,
        "moe_intermediate_size": cfg.moe_intermediate_size, "num_hidden_layers": cfg.num_layers,
        "num_nextn_predict_layers": cfg.mtp_depth, "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_heads, "n_shared_experts": cfg.num_shared_experts,
        "n_routed_experts": cfg.num_routed_experts, "routed_scaling_factor": cfg.routed_scaling_factor,
        "kv_lora_rank": cfg.kv_lora_rank, "q_lora_rank": cfg.q_lora_rank or None,
        "qk_rope_head_dim": cfg.qk_rope_head_dim, "v_head_dim": cfg.v_head_dim,
        "qk_nope_head_dim": cfg.qk_nope_head_dim, "topk_method": "noaux_tc",
        "n_group": cfg.n_group, "topk_group": cfg.topk_group,
        "num_experts_per_tok": cfg.num_experts_per_tok, "moe_layer_freq": 1,
        "first_k_dense_replace": cfg.first_k_dense, "norm_topk_prob": cfg.norm_topk_prob,
        "scoring_func": cfg.scoring.value, "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings, "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope.theta, "rope_scaling": rope_scaling,
        "rope_interleave": cfg.rope.interleaved, "attention_bias": False,
        "attention_dropout": 0.0, "tie_word_embeddings": False, "use_cache": True,
        "torch_dtype": jnp.dtype(DType(dtype).value).name,
    }


# ------------------------------------------------------------------------------------------------
# Parameter <-> tensor name mapping
# ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Leaf:
    """How one checkpoint tensor becomes a slice of one of our parameters.

    name(layer, expert) gives the HF tensor name; to_ours maps HF [out, in] layout to ours.
    `layers` / `experts`: the sizes of our leading stacked axes (0 = absent).
    """
    name: Callable[[int, int], str]
    to_ours: Callable[[np.ndarray], np.ndarray]
    to_hf: Callable[[np.ndarray], np.ndarray]
    layers: int = 0
    experts: int = 0


def _ident(a):
    return a


def _t(a):
    return a.T


def _heads_out(h: int):
    """HF [H*d, in] -> ours [in, H, d] and back."""
    return (lambda a: a.T.reshape(a.shape[1], h, -1),
            lambda a: a.reshape(a.shape[0], -1).T)


def _heads_in(h: int):
    """HF o_proj [D, H*v] -> ours [H, v, D] and back."""
    return (lambda a: a.T.reshape(h, -1, a.shape[0]),
            lambda a: a.reshape(-1, a.shape[-1]).T)


def _block_leaves(cfg: ModelConfig, prefix: str, layer_index: Callable[[int], int],
                  n: int, moe: bool) -> dict[str, _Leaf]:
    """Our paths (relative, dotted) inside a stacked Block of n layers -> _Leaf."""
    h = cfg.num_heads
    P = lambda suffix: (lambda l, e: f"model.layers.{layer_index(l)}.{suffix}")  # noqa: E731
    out = {
        "attn_norm.weight": _Leaf(P("input_layernorm.weight"), _ident, _ident, n),
        "ffn_norm.weight": _Leaf(P("post_attention_layernorm.weight"), _ident, _ident, n),
        "attn.wkv_a": _Leaf(P("self_attn.kv_a_proj_with_mqa.weight"), _t, _t, n),
        "attn.kv_norm.weight": _Leaf(P("self_attn.kv_a_layernorm.weight"), _ident, _ident, n),
        "attn.wkv_b": _Leaf(P("self_attn.kv_b_proj.weight"), *_heads_out(h), n),
        "attn.wo": _Leaf(P("self_attn.o_proj.weight"), *_heads_in(h), n),
    }
    if cfg.q_lora_rank > 0:
        out["attn.wq_a"] = _Leaf(P("self_attn.q_a_proj.weight"), _t, _t, n)
        out["attn.q_norm.weight"] = _Leaf(P("self_attn.q_a_layernorm.weight"), _ident, _ident, n)
        out["attn.wq_b"] = _Leaf(P("self_attn.q_b_proj.weight"), *_heads_out(h), n)
    else:
        out["attn.wq"] = _Leaf(P("self_attn.q_proj.weight"), *_heads_out(h), n)
    if moe:
        E = cfg.num_routed_experts
        PE = lambda suffix: (lambda l, e: f"model.layers.{layer_index(l)}.mlp.experts.{e}.{suffix}")  # noqa: E731
        out["ffn.router"] = _Leaf(P("mlp.gate.weight"), _t, _t, n)
        out["ffn.bias"] = _Leaf(P("mlp.gate.e_score_correction_bias"), _ident, _ident, n)
        out["ffn.w_gate"] = _Leaf(PE("gate_proj.weight"), _t, _t, n, E)
        out["ffn.w_up"] = _Leaf(PE("up_proj.weight"), _t, _t, n, E)
        out["ffn.w_down"] = _Leaf(PE("down_proj.weight"), _t, _t, n, E)
        if cfg.num_shared_experts > 0:
            for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
                out[f"ffn.shared.{ours}"] = _Leaf(P(f"mlp.shared_experts.{theirs}.weight"), _t, _t, n)
    else:
        for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            out[f"ffn.{ours}"] = _Leaf(P(f"mlp.{theirs}.weight"), _t, _t, n)
    return {f"{prefix}.{k}": v for k, v in out.items()}


def param_map(cfg: ModelConfig) -> dict[str, _Leaf]:
    """Every parameter path of our model (dotted) -> how to read/write it in HF layout."""
    fixed = lambda name: (lambda l, e: name)  # noqa: E731
    m = {
        "embed": _Leaf(fixed("model.embed_tokens.weight"), _ident, _ident),
        "final_norm.weight": _Leaf(fixed("model.norm.weight"), _ident, _ident),
        "lm_head": _Leaf(fixed("lm_head.weight"), _t, _t),
    }
    k = cfg.first_k_dense
    if k > 0:
        m.update(_block_leaves(cfg, "dense_layers", lambda l: l, k, moe=False))
    if cfg.num_moe_layers > 0:
        m.update(_block_leaves(cfg, "moe_layers", lambda l: l + k, cfg.num_moe_layers, moe=True))
    if cfg.mtp_depth > 0:
        base = cfg.num_layers
        D = cfg.mtp_depth
        P = lambda suffix: (lambda l, e: f"model.layers.{base + l}.{suffix}")  # noqa: E731
        m["mtp.enorm.weight"] = _Leaf(P("enorm.weight"), _ident, _ident, D)
        m["mtp.hnorm.weight"] = _Leaf(P("hnorm.weight"), _ident, _ident, D)
        m["mtp.eh_proj"] = _Leaf(P("eh_proj.weight"), _t, _t, D)
        m["mtp.norm.weight"] = _Leaf(P("shared_head.norm.weight"), _ident, _ident, D)
        m.update(_block_leaves(cfg, "mtp.block", lambda l: base + l, D,
                               moe=cfg.num_moe_layers > 0))
    return m


def _mtp_copies(cfg: ModelConfig) -> dict[str, str]:
    """Extra tensors DeepSeek-V3 MTP layers carry: copies of the shared embedding and head."""
    out = {}
    for d in range(cfg.mtp_depth):
        out[f"model.layers.{cfg.num_layers + d}.embed_tokens.weight"] = "embed"
        out[f"model.layers.{cfg.num_layers + d}.shared_head.head.weight"] = "lm_head"
    return out


def _path_str(path) -> str:
    """Dotted parameter path from a pytree key path (the Variable's own `.value` key dropped)."""
    keys = [p for p in path if not isinstance(p, jax.tree_util.GetAttrKey)]
    return ".".join(str(getattr(p, "key", getattr(p, "idx", p))) for p in keys)


# ------------------------------------------------------------------------------------------------
# Loading
# ------------------------------------------------------------------------------------------------


class _TensorIndex:
    """Which safetensors file holds each tensor; opens files lazily, reads one tensor at a time."""

    def __init__(self, directory: pathlib.Path):
        index_file = directory / "model.safetensors.index.json"
        if index_file.exists():
            weight_map = json.loads(index_file.read_text())["weight_map"]
            self.where = {name: directory / f for name, f in weight_map.items()}
        else:
            files = sorted(directory.glob("*.safetensors"))
            if not files:
                raise CheckpointError(f"{directory} holds no *.safetensors files")
            self.where = {}
            for f in files:
                with safe_open(f, framework="numpy") as st:
                    for name in st.keys():
                        self.where[name] = f
        self._open = {}

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._file(name).get_slice(name).get_shape())

    def read(self, name: str) -> np.ndarray:
        return self._file(name).get_tensor(name)

    def _file(self, name):
        path = self.where[name]
        if path not in self._open:
            if not path.exists():
                raise CheckpointError(f"the index names {path.name} for {name}, but it is missing")
            self._open[path] = safe_open(path, framework="numpy")
        return self._open[path]


def _expected_hf_shape(leaf: _Leaf, our_shape: tuple[int, ...]) -> tuple[int, ...]:
    lead = (1 if leaf.layers else 0) + (1 if leaf.experts else 0)
    return leaf.to_hf(np.empty(our_shape[lead:], np.float32)).shape


def _check_tensors(cfg: ModelConfig, abstract_state, index: _TensorIndex) -> None:
    """One error listing every missing, unexpected or mis-shaped tensor."""
    pmap = param_map(cfg)
    flat = {_path_str(p): x for p, x in jax.tree_util.tree_flatten_with_path(abstract_state)[0]}
    missing, badshape, used = [], [], set(_mtp_copies(cfg))
    for path, leaf in pmap.items():
        want = _expected_hf_shape(leaf, flat[path].shape)
        for l in range(leaf.layers or 1):
            for e in range(leaf.experts or 1):
                name = leaf.name(l, e)
                used.add(name)
                if name not in index.where:
                    missing.append(name)
                elif index.shape(name) != want:
                    badshape.append(f"{name}: checkpoint {index.shape(name)}, expected {want}")
    unexpected = sorted(n for n in index.where if n not in used and "rotary_emb" not in n)
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing tensors: {missing[:20]}"
                        + (" ..." if len(missing) > 20 else ""))
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected tensors: {unexpected[:20]}"
                        + (" ..." if len(unexpected) > 20 else ""))
    if badshape:
        problems.append(f"{len(badshape)} mis-shaped tensors: {badshape[:20]}")
    if problems:
        raise CheckpointError("checkpoint does not match its config.json: " + "; ".join(problems))


def _read_param(leaf: _Leaf, index: _TensorIndex, shape, dtype, idx: tuple) -> np.ndarray:
    """The slice `idx` of one of our parameters, assembled from its checkpoint tensors."""
    lead = (1 if leaf.layers else 0) + (1 if leaf.experts else 0)
    idx = tuple(idx) + (slice(None),) * (len(shape) - len(idx))
    ranges = [range(*s.indices(n)) for s, n in zip(idx[:lead], shape[:lead])]
    rest = idx[lead:]
    if lead == 0:
        return leaf.to_ours(index.read(leaf.name(0, 0)))[rest].astype(dtype)
    out = np.empty([len(r) for r in ranges] + list(np.empty(shape[lead:])[rest].shape), dtype)
    if lead == 1:
        for i, l in enumerate(ranges[0]):
            out[i] = leaf.to_ours(index.read(leaf.name(l, 0)))[rest]
    else:
        for i, l in enumerate(ranges[0]):
            for j, e in enumerate(ranges[1]):
                out[i, j] = leaf.to_ours(index.read(leaf.name(l, e)))[rest]
    return out


def load_hf(directory, dtype: str | None = None, shardings=None,
            execution: ExecutionConfig | None = None) -> tuple[ModelConfig, Transformer]:
    """Reads a HF DeepseekV3 / Kimi-K2 checkpoint directory -> (ModelConfig, model).

    execution: how the model computes (`model.execution`); None: `ExecutionConfig()` in the
    checkpoint's dtype. dtype ("float32"/"bfloat16"): parameter and compute dtype, overriding
    `execution`'s. shardings: optional pytree of `jax.sharding.Sharding` matching
    `nnx.state(model)`, so each device reads only its slices. Raises CheckpointError naming every
    problem found.
    """
    directory = pathlib.Path(directory)
    cfg_file = directory / "config.json"
    if not cfg_file.exists():
        raise CheckpointError(f"{directory} has no config.json; expected a Hugging Face checkpoint "
                              f"directory (config.json + *.safetensors)")
    hf = json.loads(cfg_file.read_text())
    cfg = config_from_hf(hf)
    if execution is None or dtype is not None:
        dt = DType(dtype) if dtype is not None else dtype_from_hf(hf)
        execution = dataclasses.replace(execution or ExecutionConfig(), param_dtype=dt,
                                        compute_dtype=dt)
    index = _TensorIndex(directory)
    abstract = abstract_model(cfg, execution)
    graphdef, abstract_state = nnx.split(abstract)
    _check_tensors(cfg, abstract_state, index)
    pmap = param_map(cfg)
    flat, treedef = jax.tree_util.tree_flatten_with_path(abstract_state)
    flat_shardings = (jax.tree.leaves(shardings) if shardings is not None else [None] * len(flat))
    arrays = []
    for (path, leaf_abs), sharding in zip(flat, flat_shardings):
        leaf = pmap[_path_str(path)]
        np_dtype = np.dtype(ml_dtypes.bfloat16) if leaf_abs.dtype == jnp.bfloat16 else np.dtype(
            leaf_abs.dtype)
        read = lambda idx, leaf=leaf, s=leaf_abs.shape, d=np_dtype: _read_param(leaf, index, s, d, idx)
        if sharding is None:
            arrays.append(jnp.asarray(read(())))
        else:
            arrays.append(jax.make_array_from_callback(leaf_abs.shape, sharding, read))
    state = jax.tree_util.tree_unflatten(treedef, arrays)
    return cfg, nnx.merge(graphdef, state)


# ------------------------------------------------------------------------------------------------
# Saving
# ------------------------------------------------------------------------------------------------


def save_hf(model: Transformer, directory, max_shard_bytes: int = 5 * 2**30) -> None:
    """Writes `model` as a HF DeepseekV3 checkpoint (config.json + safetensors [+ index]).

    Tensors are converted one parameter at a time and flushed to a shard file whenever
    `max_shard_bytes` is reached. Files are written to a temporary directory and moved into place.
    """
    cfg = model.cfg
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    pmap = param_map(cfg)
    state = nnx.state(model)
    flat = {_path_str(p): x for p, x in jax.tree_util.tree_flatten_with_path(state)[0]}
    tmp = pathlib.Path(tempfile.mkdtemp(dir=directory, prefix=".tmp-save-"))
    shards, pending, pending_bytes = [], {}, 0

    def flush():
        nonlocal pending, pending_bytes
        if pending:
            name = f"part-{len(shards):05d}.safetensors"
            save_file(pending, str(tmp / name), metadata={"format": "pt"})
            shards.append((name, list(pending)))
            pending, pending_bytes = {}, 0

    def emit(name, array):
        nonlocal pending_bytes
        arr = np.ascontiguousarray(array)
        if pending_bytes + arr.nbytes > max_shard_bytes:
            flush()
        pending[name] = arr
        pending_bytes += arr.nbytes

    for path, leaf in pmap.items():
        value = np.asarray(jax.device_get(flat[path]))
        for l in range(leaf.layers or 1):
            for e in range(leaf.experts or 1):
                part = value
                if leaf.layers:
                    part = part[l]
                if leaf.experts:
                    part = part[e]
                emit(leaf.name(l, e), leaf.to_hf(part))
    for name, source in _mtp_copies(cfg).items():
        emit(name, pmap[source].to_hf(np.asarray(jax.device_get(flat[source]))))
    flush()
    if len(shards) == 1:
        os.replace(tmp / shards[0][0], tmp / "model.safetensors")
    else:
        total = sum((tmp / n).stat().st_size for n, _ in shards)
        final = []
        for i, (name, names) in enumerate(shards):
            new = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            os.replace(tmp / name, tmp / new)
            final.append((new, names))
        weight_map = {t: f for f, names in final for t in names}
        (tmp / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    (tmp / "config.json").write_text(json.dumps(config_to_hf(cfg, model.execution.param_dtype),
                                                indent=1))
    for old in list(directory.glob("*.safetensors")) + [directory / "model.safetensors.index.json"]:
        if old.exists():
            old.unlink()
    for f in tmp.iterdir():
        os.replace(f, directory / f.name)
    tmp.rmdir()
