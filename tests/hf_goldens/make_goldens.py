"""Golden parity data from Hugging Face transformers' ``DeepseekV3ForCausalLM``.

These files are the *independent reference* the JAX model in ``composer_jax`` is
tested against: tiny random DeepSeek-V3 / Kimi-K2 style checkpoints saved by
transformers itself, plus the logits transformers computes for a fixed batch of
token ids.  The JAX side only needs numpy + safetensors + json to read them;
torch/transformers are needed ONLY to regenerate them.

Environment (separate from the project's Python 3.12 environment)
-----------------------------------------------------------------
This script runs ONLY under a dedicated Python 3.11 venv, ``.venv-goldens`` in the checkout,
with CPU-only torch and a pinned transformers.  Create it with::

    python3.11 -m venv .venv-goldens
    .venv-goldens/bin/pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
    #   (the CPU-only wheel torch-2.13.0+cpu, never a CUDA build)
    .venv-goldens/bin/pip install transformers==5.24.0 safetensors==0.8.0 numpy==2.4.6

(transformers 5.25.0 is newer but does not install cleanly: it requires
``kernels>=0.19.1,<0.20`` which is not on the index; 5.24.0 is the newest that does.)

Regenerate (from the repository root)::

    .venv-goldens/bin/python tests/hf_goldens/make_goldens.py

This rewrites ``tests/hf_goldens/data/`` and ``tests/hf_goldens/README.md``.  The
script refuses to run under any other torch/transformers version, so the goldens
always come from the pinned reference.  Output is deterministic (fixed seeds, CPU,
float32) up to float32 summation-order noise.

What is in ``data/<name>/``
---------------------------
* ``config.json`` -- written by ``save_pretrained``.  Folders marked *legacy json*
  are afterwards rewritten into the layout of the real DeepSeek-V3 / Kimi-K2 hub
  configs: top-level ``rope_theta`` and ``rope_scaling={"type": "yarn", ...}``
  instead of transformers-5's ``rope_parameters``, plus the hub-only keys
  ``topk_method="noaux_tc"``, ``scoring_func="sigmoid"``, ``moe_layer_freq=1``,
  ``ep_size=1`` (transformers ignores those four), and without ``rope_interleave``
  (absent means True, the transformers default) or the derived ``head_dim``/``qk_head_dim``.  Every folder -- legacy or
  not -- is re-loaded with ``AutoModelForCausalLM.from_pretrained`` and must
  reproduce the golden logits (checked by this script), so a JAX loader has to
  accept both spellings.
* ``model.safetensors`` or, for the *sharded* folder, ``model-0000k-of-0000n.safetensors``
  + ``model.safetensors.index.json``.  float32.  Routed experts are stored per
  expert in the original DeepSeek layout
  (``model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight``), NOT as the
  fused 3-D ``gate_up_proj`` that transformers uses in memory.
  ``model.layers.{i}.mlp.gate.e_score_correction_bias`` is present and non-zero.
* ``golden.npz`` (numpy, load with ``np.load``):
    - ``input_ids``      int32   [B=2, T]
    - ``logits``         float32 [B, T, vocab]  -- forward with NO attention mask
      (pure causal), default positions 0..T-1, eager attention, eager experts.
    - ``hidden_states``  float32 [L+1, B, T, hidden] -- [0] = token embeddings,
      [i+1] = output of decoder layer i (residual stream, before the final norm).
    - ``final_hidden``   float32 [B, T, hidden] -- after ``model.norm``.
    - ``router_layers``  int32   [n_moe] -- decoder-layer index of each MoE layer.
    - ``router_logits``  float32 [n_moe, B*T, n_routed_experts] -- x @ gate.weight.T (pre-sigmoid).
    - ``topk_idx``       int32   [n_moe, B*T, k] -- selected experts, sorted ascending per token.
    - ``topk_weight``    float32 [n_moe, B*T, k] -- matching combine weights (normalised, times
      routed_scaling_factor).  Tokens are flattened row-major (b * T + t).
  The extra arrays are for localising a mismatch; the parity contract is ``logits``.
* ``data/manifest.json`` -- versions, per-config settings, max|logits|, std, router
  diagnostics (fraction of tokens whose expert choice would change without the
  correction bias / without group limiting), and the round-trip results.

Weights are all random (normal, ~1/sqrt(fan_in) for matrices, norm weights
1 + 0.2*N(0,1), correction bias ~ N(0, 0.1^2)) so that logits are O(1) and no
path is degenerate.  ``base_with_mtp`` is ``base`` (same weights, same logits) plus
an extra multi-token-prediction layer ``model.layers.3.*`` (enorm/hnorm/eh_proj/
shared_head/...) and ``num_nextn_predict_layers=1``; transformers does not use
those weights in the forward, and a JAX loader must skip them too.
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import shutil
import sys
from pathlib import Path

PINNED_TORCH = "2.13.0+cpu"
PINNED_TRANSFORMERS = "5.24.0"

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"


def _check_env():
    try:
        import torch
        import transformers
    except ImportError as e:  # pragma: no cover
        sys.exit(f"make_goldens.py must run under the .venv-goldens venv (see docstring): {e}")
    if torch.__version__ != PINNED_TORCH or transformers.__version__ != PINNED_TRANSFORMERS:
        sys.exit(
            f"make_goldens.py needs torch=={PINNED_TORCH} and transformers=={PINNED_TRANSFORMERS}, found "
            f"torch=={torch.__version__} transformers=={transformers.__version__}. Use the .venv-goldens venv (see docstring)."
        )


# ---------------------------------------------------------------------------
# Configurations
# ---------------------------------------------------------------------------

COMMON = dict(
    vocab_size=160,
    hidden_size=48,
    intermediate_size=96,  # dense-layer MLP width
    moe_intermediate_size=16,  # per routed expert; shared expert width = 16 * n_shared_experts
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    q_lora_rank=32,
    kv_lora_rank=24,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=12,  # deliberately != qk_nope_head_dim so kv_b_proj layout bugs show
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_group=1,
    topk_group=1,
    n_shared_experts=1,
    first_k_dense_replace=1,
    routed_scaling_factor=2.5,
    norm_topk_prob=True,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    max_position_embeddings=64,
    tie_word_embeddings=False,
    attention_bias=False,
    hidden_act="silu",
    num_nextn_predict_layers=0,
    bos_token_id=0,
    eos_token_id=1,
)

CONFIGS = {
    "base": dict(
        seed=1000,
        seq_len=24,
        overrides=dict(),  # rope_interleave left at the transformers default (True)
    ),
    "no_qlora": dict(
        seed=1001,
        seq_len=20,
        overrides=dict(q_lora_rank=None, rope_interleave=False),
    ),
    "grouped": dict(
        seed=1002,
        seq_len=24,
        overrides=dict(n_group=4, topk_group=2, n_routed_experts=16, num_experts_per_tok=4),
    ),
    "yarn": dict(
        seed=1003,
        seq_len=40,
        legacy_json=True,
        overrides=dict(
            # qk_rope_head_dim=32 so the YaRN ramp has a fractional entry (ramp = [0, .5, 1, ...]).
            qk_rope_head_dim=32,
            max_position_embeddings=64,
            rope_scaling={
                "type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 16,
                "beta_fast": 32,
                "beta_slow": 1,
                # DeepSeek-V3 / Kimi-K2 ship mscale == mscale_all_dim (=1.0), which makes the cos/sin
                # attention_factor exactly 1.  Different values here exercise that factor too.
                "mscale": 1.0,
                "mscale_all_dim": 0.8,
            },
        ),
    ),
    "interleave": dict(
        # the non-default layout: rope_interleave=False (plain rotate_half); base/grouped/yarn use True
        seed=1004,
        seq_len=24,
        overrides=dict(rope_interleave=False),
    ),
    "dense_prefix2_shared2": dict(
        seed=1005,
        seq_len=24,
        legacy_json=True,
        max_shard_size="60KB",  # exercises model.safetensors.index.json
        overrides=dict(num_hidden_layers=4, first_k_dense_replace=2, n_shared_experts=2),
    ),
    "base_with_mtp": dict(
        same_weights_as="base",
        overrides=dict(num_nextn_predict_layers=1),
    ),
}
# transformers' DeepseekV3 only implements sigmoid scoring + "noaux_tc" top-k (topk_method /
# scoring_func are not read), so there is no softmax / greedy variant to test.


# ---------------------------------------------------------------------------


def build_config(name):
    from transformers import DeepseekV3Config

    spec = CONFIGS[name]
    if "same_weights_as" in spec:
        kw = dict(COMMON)
        kw.update(CONFIGS[spec["same_weights_as"]]["overrides"])
    else:
        kw = dict(COMMON)
    kw.update(spec["overrides"])
    return DeepseekV3Config(**kw)


def randomise_(model, seed):
    """Overwrite every parameter and the correction-bias buffer with seeded random values."""
    import torch

    g = torch.Generator().manual_seed(seed)
    H = model.config.hidden_size

    def normal(shape, std):
        return torch.randn(shape, generator=g, dtype=torch.float32) * std

    named = list(model.named_parameters()) + [
        (n, b) for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")
    ]
    seen = set()
    with torch.no_grad():
        for n, p in sorted(named, key=lambda t: t[0]):
            if n in seen:
                continue
            seen.add(n)
            if n.endswith("e_score_correction_bias"):
                new = normal(p.shape, 0.1)
            elif n.endswith("mlp.gate.weight"):  # router: logits ~ N(0, 1.5^2) -> spread-out sigmoid scores
                new = normal(p.shape, 1.5 / math.sqrt(H))
            elif "norm" in n:  # RMSNorm weights (input/post-attn/q_a/kv_a/final)
                new = 1.0 + normal(p.shape, 0.2)
            elif n.endswith("embed_tokens.weight"):
                new = normal(p.shape, 1.0)
            elif n == "lm_head.weight":
                new = normal(p.shape, 1.5 / math.sqrt(H))
            elif n.endswith("experts.gate_up_proj") or n.endswith("experts.down_proj"):
                new = normal(p.shape, 1.0 / math.sqrt(p.shape[-1]))
            elif p.dim() == 2:
                new = normal(p.shape, 1.0 / math.sqrt(p.shape[-1]))
            else:
                raise RuntimeError(f"unhandled tensor {n} {tuple(p.shape)}")
            p.copy_(new)
    # nothing left at a default value
    for n, p in named:
        assert not torch.all(p == 0) and not torch.all(p == 1), n


class Recorder:
    """Forward hooks capturing the residual stream and the router decisions."""

    def __init__(self, model):
        self.model = model
        self.handles = []
        self.hidden = []
        self.final = None
        self.router = {}
        m = model.model
        self.handles.append(m.embed_tokens.register_forward_hook(lambda mod, i, o: self.hidden.append(o.detach())))
        for li, layer in enumerate(m.layers):
            self.handles.append(layer.register_forward_hook(self._layer_hook))
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None and hasattr(gate, "e_score_correction_bias"):
                self.handles.append(gate.register_forward_hook(self._make_router_hook(li)))
        self.handles.append(m.norm.register_forward_hook(self._final_hook))

    def _layer_hook(self, mod, inp, out):
        self.hidden.append((out[0] if isinstance(out, tuple) else out).detach())

    def _final_hook(self, mod, inp, out):
        self.final = out.detach()

    def _make_router_hook(self, li):
        def hook(mod, inp, out):
            self.router[li] = tuple(t.detach() for t in out)

        return hook

    def remove(self):
        for h in self.handles:
            h.remove()


def router_diagnostics(cfg, router_logits, bias, topk_idx):
    """Fractions of tokens whose selected set would differ without the bias / without group limiting."""
    import torch

    scores = router_logits.sigmoid()
    k = cfg.num_experts_per_tok

    def grouped_select(s_choice):
        G = cfg.n_group
        E = cfg.n_routed_experts
        gs = s_choice.view(-1, G, E // G).topk(2, dim=-1)[0].sum(-1)
        gi = torch.topk(gs, k=cfg.topk_group, dim=-1)[1]
        gm = torch.zeros_like(gs).scatter_(1, gi, 1)
        sm = gm.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)
        return torch.topk(s_choice.masked_fill(~sm.bool(), float("-inf")), k=k, dim=-1)[1]

    ref = torch.sort(topk_idx, dim=-1)[0]
    assert torch.equal(ref, torch.sort(grouped_select(scores + bias), dim=-1)[0])
    no_bias = torch.sort(grouped_select(scores), dim=-1)[0]
    no_group = torch.sort(torch.topk(scores + bias, k=k, dim=-1)[1], dim=-1)[0]
    return dict(
        frac_changed_without_bias=float((no_bias != ref).any(-1).float().mean()),
        frac_changed_without_group_limit=float((no_group != ref).any(-1).float().mean()),
    )


def run_forward(model, input_ids):
    import torch

    rec = Recorder(model)
    try:
        with torch.no_grad():
            out = model(input_ids=input_ids, use_cache=False)
    finally:
        rec.remove()
    return out.logits.detach(), rec


def to_legacy_config_json(path):
    """Rewrite a transformers-5 config.json into the DeepSeek-V3 hub layout."""
    cfg = json.loads(path.read_text())
    rp = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rp.pop("rope_theta")
    rtype = rp.pop("rope_type")
    rp.pop("type", None)
    if rtype == "default":
        cfg["rope_scaling"] = None
    else:
        cfg["rope_scaling"] = {"type": rtype, **rp}
    cfg.update(topk_method="noaux_tc", scoring_func="sigmoid", moe_layer_freq=1, ep_size=1)
    # transformers-5 derived keys that real hub configs do not have
    cfg.pop("head_dim", None)
    cfg.pop("qk_head_dim", None)
    if cfg.get("rope_interleave") is True:  # hub configs omit it; transformers' default is True
        del cfg["rope_interleave"]
    path.write_text(json.dumps(dict(sorted(cfg.items())), indent=2) + "\n")


def add_mtp_weights(folder, cfg, seed):
    """Append a DeepSeek-V3-style MTP layer model.layers.{L}.* to a single-file checkpoint."""
    import torch
    from safetensors.torch import load_file, save_file

    st = folder / "model.safetensors"
    tensors = load_file(st)
    g = torch.Generator().manual_seed(seed)
    L, H, V = cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size
    p = f"model.layers.{L}."
    src = f"model.layers.{L - 1}."  # copy shapes of the last (MoE) layer for the transformer block
    extra = {}
    for k, v in tensors.items():
        if k.startswith(src):
            extra[p + k[len(src):]] = torch.randn(v.shape, generator=g) * 0.05
    extra[p + "enorm.weight"] = 1.0 + 0.2 * torch.randn(H, generator=g)
    extra[p + "hnorm.weight"] = 1.0 + 0.2 * torch.randn(H, generator=g)
    extra[p + "eh_proj.weight"] = torch.randn(H, 2 * H, generator=g) * 0.05
    extra[p + "embed_tokens.weight"] = torch.randn(V, H, generator=g)
    extra[p + "shared_head.norm.weight"] = 1.0 + 0.2 * torch.randn(H, generator=g)
    extra[p + "shared_head.head.weight"] = torch.randn(V, H, generator=g) * 0.05
    tensors.update(extra)
    save_file({k: v.contiguous() for k, v in sorted(tensors.items())}, str(st), metadata={"format": "pt"})
    return sorted(extra)


def roundtrip(folder, input_ids, golden_logits, **kw):
    """Reload with AutoModelForCausalLM.from_pretrained and compare logits. Returns (maxdiff, loading_info, log)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    tlog = transformers.utils.logging.get_logger("transformers")
    tlog.addHandler(handler)
    try:
        model, info = AutoModelForCausalLM.from_pretrained(str(folder), output_loading_info=True, **kw)
    finally:
        tlog.removeHandler(handler)
    model.eval()
    assert next(model.parameters()).dtype == torch.float32
    with torch.no_grad():
        logits = model(input_ids=input_ids, use_cache=False).logits
    diff = float((logits - golden_logits).abs().max())
    info = {k: sorted(v) if isinstance(v, (set, list)) else str(v) for k, v in info.items()}
    return diff, info, buf.getvalue()


def folder_size(folder):
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def main():
    _check_env()
    import numpy as np
    import torch
    import transformers
    from transformers import DeepseekV3ForCausalLM
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    torch.set_num_threads(1)  # deterministic summation order on CPU
    transformers.utils.logging.set_verbosity_warning()
    transformers.utils.logging.disable_progress_bar()

    if DATA.exists():
        shutil.rmtree(DATA)
    DATA.mkdir(parents=True)

    manifest = dict(
        generator="tests/hf_goldens/make_goldens.py",
        torch=torch.__version__,
        transformers=transformers.__version__,
        configs={},
    )
    goldens = {}

    for name, spec in CONFIGS.items():
        folder = DATA / name
        cfg = build_config(name)
        base_name = spec.get("same_weights_as")
        seed = CONFIGS[base_name]["seed"] if base_name else spec["seed"]
        seq_len = CONFIGS[base_name]["seq_len"] if base_name else spec["seq_len"]

        torch.manual_seed(seed)
        model = DeepseekV3ForCausalLM(cfg)
        model.set_attn_implementation("eager")
        model.set_experts_implementation("eager")
        randomise_(model, seed)
        model.eval()

        g = torch.Generator().manual_seed(seed + 7)
        input_ids = torch.randint(0, cfg.vocab_size, (2, seq_len), generator=g)

        logits, rec = run_forward(model, input_ids)
        if base_name:
            assert torch.equal(logits, goldens[base_name]), "base_with_mtp must reproduce base"

        std = float(logits.std())
        maxabs = float(logits.abs().max())
        assert std > 0.1, (name, std)
        assert maxabs < 30, (name, maxabs)

        # router diagnostics + arrays
        moe_layers = sorted(rec.router)
        r_logits, r_idx, r_w, diags = [], [], [], {}
        for li in moe_layers:
            rl, tw, ti = rec.router[li]
            order = torch.argsort(ti, dim=-1)
            r_logits.append(rl)
            r_idx.append(torch.gather(ti, 1, order))
            r_w.append(torch.gather(tw, 1, order))
            bias = model.model.layers[li].mlp.gate.e_score_correction_bias
            diags[str(li)] = router_diagnostics(cfg, rl, bias, ti)
            assert diags[str(li)]["frac_changed_without_bias"] > 0, (name, li, "bias never matters")
        if cfg.n_group > 1:
            assert any(d["frac_changed_without_group_limit"] > 0 for d in diags.values()), name

        # cross-check against transformers' default kernels (sdpa attention, grouped_mm experts)
        folder.mkdir(parents=True)
        save_kw = {}
        if "max_shard_size" in spec:
            save_kw["max_shard_size"] = spec["max_shard_size"]
        model.save_pretrained(str(folder), safe_serialization=True, **save_kw)
        mtp_keys = []
        if spec["overrides"].get("num_nextn_predict_layers", 0) > 0:
            mtp_keys = add_mtp_weights(folder, cfg, seed + 13)
        if spec.get("legacy_json"):
            to_legacy_config_json(folder / "config.json")

        np.savez_compressed(
            folder / "golden.npz",
            input_ids=input_ids.numpy().astype(np.int32),
            logits=logits.numpy().astype(np.float32),
            hidden_states=torch.stack(rec.hidden).numpy().astype(np.float32),
            final_hidden=rec.final.numpy().astype(np.float32),
            router_layers=np.asarray(moe_layers, dtype=np.int32),
            router_logits=torch.stack(r_logits).numpy().astype(np.float32),
            topk_idx=torch.stack(r_idx).numpy().astype(np.int32),
            topk_weight=torch.stack(r_w).numpy().astype(np.float32),
        )
        goldens[name] = logits

        # round trips
        rt_eager, info_eager, log_eager = roundtrip(
            folder, input_ids, logits, attn_implementation="eager", experts_implementation="eager"
        )
        rt_default, _, _ = roundtrip(folder, input_ids, logits)
        assert rt_eager == 0.0 or rt_eager < 1e-5, (name, rt_eager)
        assert rt_default < 1e-4, (name, rt_default)

        yarn_info = None
        rp = model.config.rope_parameters
        if rp.get("rope_type") == "yarn":
            inv_freq, att = ROPE_INIT_FUNCTIONS["yarn"](model.config)
            yarn_info = dict(
                attention_factor=att,
                softmax_scale=model.model.layers[0].self_attn.scaling,
                inv_freq=[float(x) for x in inv_freq],
                positions_past_original_max=seq_len - rp["original_max_position_embeddings"],
            )

        files = sorted(f.name for f in folder.iterdir())
        size = folder_size(folder)
        entry = dict(
            seed=seed,
            batch=2,
            seq_len=seq_len,
            config={k: getattr(cfg, k) for k in sorted(COMMON) if k != "rope_theta"}
            | dict(rope_parameters=rp, rope_interleave=cfg.rope_interleave),
            legacy_config_json=bool(spec.get("legacy_json")),
            sharded=(folder / "model.safetensors.index.json").exists(),
            files=files,
            size_bytes=size,
            max_abs_logits=maxabs,
            logits_std=std,
            moe_layers=moe_layers,
            router_diagnostics=diags,
            roundtrip_maxdiff_eager=rt_eager,
            roundtrip_maxdiff_default_sdpa_grouped_mm=rt_default,
            roundtrip_unexpected_keys=info_eager.get("unexpected_keys", []),
            roundtrip_missing_keys=info_eager.get("missing_keys", []),
            # the folder relative to the repository root, not this machine's path
            roundtrip_log=log_eager.strip().replace(str(HERE.parents[1]) + "/", ""),
        )
        if mtp_keys:
            entry["mtp_keys"] = mtp_keys
        if yarn_info:
            entry["yarn"] = yarn_info
        manifest["configs"][name] = entry
        print(
            f"{name:24s} T={seq_len:3d} max|logits|={maxabs:7.3f} std={std:6.3f} size={size / 1024:7.1f} KiB "
            f"rt_eager={rt_eager:.1e} rt_default={rt_default:.1e} "
            f"bias_matters={[round(d['frac_changed_without_bias'], 2) for d in diags.values()]} "
            f"group_matters={[round(d['frac_changed_without_group_limit'], 2) for d in diags.values()]}"
        )
        if mtp_keys or entry["roundtrip_unexpected_keys"]:
            print(f"    unexpected on reload: {len(entry['roundtrip_unexpected_keys'])} keys; log: {log_eager.strip()[:300]!r}")
        if yarn_info:
            print(f"    yarn: attention_factor={yarn_info['attention_factor']:.6f} softmax_scale={yarn_info['softmax_scale']:.6f}")

    (DATA / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str) + "\n")
    total = folder_size(DATA)
    print(f"total data size: {total / 1024:.1f} KiB")
    assert total < 5 * 1024 * 1024
    for name in CONFIGS:
        assert manifest["configs"][name]["size_bytes"] < 1024 * 1024, name

    write_readme(manifest, total)


def write_readme(manifest, total):
    rows = [
        "| folder | key settings | T | max abs logit | size |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, e in manifest["configs"].items():
        c = e["config"]
        rp = c["rope_parameters"]
        bits = [
            f"L={c['num_hidden_layers']}",
            f"dense={c['first_k_dense_replace']}",
            f"q_lora={c['q_lora_rank']}",
            f"E={c['n_routed_experts']}/k={c['num_experts_per_tok']}",
            f"groups={c['n_group']}/{c['topk_group']}",
            f"shared={c['n_shared_experts']}",
            f"rope_dim={c['qk_rope_head_dim']}",
            f"interleave={c['rope_interleave']}",
            f"rope={rp['rope_type']}",
        ]
        if rp["rope_type"] == "yarn":
            bits.append(
                f"(factor={rp['factor']}, orig_max={rp['original_max_position_embeddings']}, "
                f"mscale={rp['mscale']}, mscale_all_dim={rp['mscale_all_dim']})"
            )
        if c["num_nextn_predict_layers"]:
            bits.append(f"mtp_layers={c['num_nextn_predict_layers']} (+MTP weights)")
        if e["legacy_config_json"]:
            bits.append("legacy json")
        if e["sharded"]:
            bits.append("sharded")
        rows.append(
            f"| `{name}` | {', '.join(bits)} | {e['seq_len']} | {e['max_abs_logits']:.3f} | {e['size_bytes'] / 1024:.0f} KiB |"
        )
    text = (
        "# HF transformers golden data for DeepSeek-V3\n\n"
        "(This file is generated by `make_goldens.py`; the text below is that script's docstring.)\n\n"
        "```text\n" + __doc__.strip("\n") + "\n```\n\n"
        f"## Generated configurations (torch {manifest['torch']}, transformers {manifest['transformers']})\n\n"
        "Common: hidden=48, vocab=160, 4 heads (nope 16, v 12), kv_lora_rank=24, moe_intermediate_size=16, "
        "dense intermediate 96, rms_norm_eps=1e-6, rope_theta=1e4, routed_scaling_factor=2.5, "
        "norm_topk_prob=True, B=2, float32.\n\n" + "\n".join(rows) + f"\n\nTotal: {total / 1024:.0f} KiB.\n"
    )
    (HERE / "README.md").write_text(text)


if __name__ == "__main__":
    main()
