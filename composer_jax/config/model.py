"""The `model` section: the architecture only (what the weights mean) and its presets."""
from __future__ import annotations

import dataclasses
import enum

from composer_jax.config.checks import _check, _coerce_enums


class ScoringFunc(str, enum.Enum):
    """How router logits become expert scores."""
    SIGMOID = "sigmoid"   # DeepSeek-V3 / Kimi K2
    SOFTMAX = "softmax"   # DeepSeek-V2 style


class RopeScaling(str, enum.Enum):
    NONE = "none"
    YARN = "yarn"


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding of the decoupled 64-dim (qk_rope_head_dim) part of q and k.

    `interleaved=True` rotates adjacent pairs (x0, x1), (x2, x3), ... (the DeepSeek checkpoint layout,
    HF `rope_interleave=True`); False rotates (x_i, x_{i + d/2}) (HF's `rotate_half`).
    YaRN fields follow HF's `rope_scaling` keys; `mscale_all_dim > 0` multiplies the softmax scale by
    yarn_mscale(factor, mscale_all_dim)^2 as DeepSeek-V3 does.
    """
    theta: float = 10000.0              # rotary base frequency
    scaling: RopeScaling = RopeScaling.NONE  # none | yarn (context extension with YaRN)
    factor: float = 1.0
    original_max_position: int = 4096   # YaRN: the context the model was trained at
    beta_fast: float = 32.0             # YaRN: high-frequency boundary (rotations)
    beta_slow: float = 1.0              # YaRN: low-frequency boundary (rotations)
    mscale: float = 1.0                 # YaRN: attention temperature scale
    mscale_all_dim: float = 0.0
    interleaved: bool = True

    def __post_init__(self):
        _coerce_enums(self, "model.rope")
        _check(self.theta > 0, f"model.rope.theta must be > 0, got {self.theta}")
        _check(self.factor >= 1.0, f"model.rope.factor must be >= 1, got {self.factor}")
        _check(self.original_max_position > 0,
               f"model.rope.original_max_position must be > 0, got {self.original_max_position}")
        _check(self.beta_fast > 0 and self.beta_slow > 0,
               f"model.rope.beta_fast/beta_slow must be > 0, got {self.beta_fast}/{self.beta_slow}")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A DeepSeek-V3 / Kimi-K2 architecture: MLA attention, shared + routed experts, MTP.

    Layers [0, first_k_dense) use a dense SwiGLU FFN of width `dense_intermediate_size`; the rest
    use MoE with `num_routed_experts` experts of width `moe_intermediate_size`, top
    `num_experts_per_tok`, plus `num_shared_experts` always-on experts (one SwiGLU of width
    num_shared_experts * moe_intermediate_size). `q_lora_rank == 0` means a plain q projection.

    Architecture only: every field changes what the weights mean (a checkpoint restore compares
    the whole section). How the model is computed lives in `ExecutionConfig`; training-only
    coefficients (router bias update rate, sequence-wise balance loss, init std) in `TrainConfig`.
    """
    # the preset this architecture came from (a label; 'custom' when built by hand)
    name: str = "custom"
    vocab_size: int = 256               # token vocabulary (embedding and output rows)
    hidden_size: int = 64               # model width d_model
    num_layers: int = 2                 # transformer blocks
    first_k_dense: int = 1              # the first k blocks use a dense SwiGLU FFN instead of MoE
    dense_intermediate_size: int = 128
    moe_intermediate_size: int = 32
    num_routed_experts: int = 8
    num_shared_experts: int = 1
    num_experts_per_tok: int = 2
    n_group: int = 1                    # expert groups for group-limited routing (1 = off)
    topk_group: int = 1                 # groups a token may route to (of n_group)
    routed_scaling_factor: float = 2.5  # scale of the routed experts' combined output
    # router logits -> expert scores: sigmoid (DeepSeek-V3, Kimi K2) | softmax
    scoring: ScoringFunc = ScoringFunc.SIGMOID
    norm_topk_prob: bool = True         # renormalise the chosen experts' scores to sum to 1
    num_heads: int = 4                  # attention heads
    q_lora_rank: int = 32
    kv_lora_rank: int = 16              # MLA: rank of the compressed key/value latent
    qk_nope_head_dim: int = 16          # per-head query/key dims without rotary embedding
    qk_rope_head_dim: int = 8  # per-head query/key dims with rotary embedding (decoupled RoPE)
    v_head_dim: int = 16                # per-head value dims
    rope: RopeConfig = RopeConfig()
    # longest sequence the model is built for (data.seq_len <= this)
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-6          # epsilon of every RMSNorm
    mtp_depth: int = 1                  # multi-token prediction depths (0 = no MTP heads)

    def __post_init__(self):
        _coerce_enums(self, "model")
        p = "model."
        for f in ("vocab_size", "hidden_size", "num_layers", "dense_intermediate_size",
                  "moe_intermediate_size", "num_heads", "kv_lora_rank", "qk_nope_head_dim",
                  "v_head_dim", "max_position_embeddings"):
            _check(getattr(self, f) > 0, f"{p}{f} must be > 0, got {getattr(self, f)}")
        _check(0 <= self.first_k_dense <= self.num_layers,
               f"{p}first_k_dense must be in [0, num_layers={self.num_layers}], got {self.first_k_dense}")
        _check(self.q_lora_rank >= 0, f"{p}q_lora_rank must be >= 0 (0 = plain q projection), "
                                      f"got {self.q_lora_rank}")
        _check(self.qk_rope_head_dim > 0 and self.qk_rope_head_dim % 2 == 0,
               f"{p}qk_rope_head_dim must be a positive even number (RoPE rotates pairs), "
               f"got {self.qk_rope_head_dim}")
        _check(self.mtp_depth >= 0, f"{p}mtp_depth must be >= 0, got {self.mtp_depth}")
        if self.num_moe_layers > 0 or self.mtp_depth > 0:
            _check(self.num_routed_experts >= 1,
                   f"{p}num_routed_experts must be >= 1, got {self.num_routed_experts}")
            _check(1 <= self.num_experts_per_tok <= self.num_routed_experts,
                   f"{p}num_experts_per_tok (top-k) must be in [1, num_routed_experts="
                   f"{self.num_routed_experts}], got {self.num_experts_per_tok}")
            _check(self.n_group >= 1 and self.num_routed_experts % self.n_group == 0,
                   f"{p}n_group={self.n_group} must be >= 1 and divide num_routed_experts="
                   f"{self.num_routed_experts}")
            _check(1 <= self.topk_group <= self.n_group,
                   f"{p}topk_group must be in [1, n_group={self.n_group}], got {self.topk_group}")
            if self.n_group > 1:
                per_group = self.num_routed_experts // self.n_group
                _check(self.topk_group * per_group >= self.num_experts_per_tok,
                       f"{p}topk_group={self.topk_group} groups of {per_group} experts hold fewer than "
                       f"num_experts_per_tok={self.num_experts_per_tok} experts")
                _check(self.scoring == ScoringFunc.SIGMOID and per_group >= 2,
                       f"{p}group-limited routing (n_group > 1) needs sigmoid scoring and >= 2 "
                       f"experts per group (group score = sum of its top-2)")
            _check(self.num_shared_experts >= 0,
                   f"{p}num_shared_experts must be >= 0, got {self.num_shared_experts}")
        _check(self.routed_scaling_factor > 0,
               f"{p}routed_scaling_factor must be > 0, got {self.routed_scaling_factor}")
        _check(self.rms_norm_eps > 0, f"{p}rms_norm_eps must be > 0, got {self.rms_norm_eps}")

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.first_k_dense

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


def kimi_k2_5() -> ModelConfig:
    """Kimi K2.5's text model (= Kimi K2's DeepSeek-V3 architecture; moonshotai/Kimi-K2* config.json).

    Disputed values, both configurable: rms_norm_eps (the released config.json says 1e-6; some
    re-implementations use 1e-5) and YaRN beta_fast (the released config says 1.0; the DeepSeek
    default is 32). The released config ships no MTP layers (num_nextn_predict_layers = 0).
    """
    return ModelConfig(
        name="kimi_k2_5", vocab_size=163840, hidden_size=7168, num_layers=61, first_k_dense=1,
        dense_intermediate_size=18432, moe_intermediate_size=2048, num_routed_experts=384,
        num_shared_experts=1, num_experts_per_tok=8, n_group=1, topk_group=1,
        routed_scaling_factor=2.827, scoring=ScoringFunc.SIGMOID, norm_topk_prob=True,
        num_heads=64, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128,
        rope=RopeConfig(theta=50000.0, scaling=RopeScaling.YARN, factor=64.0,
                        original_max_position=4096, beta_fast=1.0, beta_slow=1.0, mscale=1.0,
                        mscale_all_dim=1.0, interleaved=True),
        max_position_embeddings=262144, rms_norm_eps=1e-6, mtp_depth=0)


def deepseek_v3() -> ModelConfig:
    """DeepSeek-V3 (671B total / 37B active; deepseek-ai/DeepSeek-V3 config.json)."""
    return ModelConfig(
        name="deepseek_v3", vocab_size=129280, hidden_size=7168, num_layers=61, first_k_dense=3,
        dense_intermediate_size=18432, moe_intermediate_size=2048, num_routed_experts=256,
        num_shared_experts=1, num_experts_per_tok=8, n_group=8, topk_group=4,
        routed_scaling_factor=2.5, scoring=ScoringFunc.SIGMOID, norm_topk_prob=True,
        num_heads=128, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128,
        rope=RopeConfig(theta=10000.0, scaling=RopeScaling.YARN, factor=40.0,
                        original_max_position=4096, beta_fast=32.0, beta_slow=1.0, mscale=1.0,
                        mscale_all_dim=1.0, interleaved=True),
        max_position_embeddings=163840, rms_norm_eps=1e-6, mtp_depth=1)


def tiny() -> ModelConfig:
    """Tests: every feature on, a forward pass in well under a second on CPU."""
    return ModelConfig(name="tiny")


def small() -> ModelConfig:
    """CPU experiments: learns Python code in tens of minutes on 2 cores."""
    return ModelConfig(
        name="small", vocab_size=4096, hidden_size=256, num_layers=4, first_k_dense=1,
        dense_intermediate_size=768, moe_intermediate_size=128, num_routed_experts=32,
        num_shared_experts=1, num_experts_per_tok=4, n_group=4, topk_group=2,
        routed_scaling_factor=2.5, num_heads=4, q_lora_rank=128, kv_lora_rank=64,
        qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
        rope=RopeConfig(theta=10000.0), max_position_embeddings=4096, mtp_depth=1)


MODEL_PRESETS = {"kimi_k2_5": kimi_k2_5, "deepseek_v3": deepseek_v3, "tiny": tiny, "small": small}
