"""Frozen, typed, validated configuration for every part of composer_jax.

One `Config` holds one section per subsystem: `model`, `execution`, `mesh`, `data`, `train`, `rl`,
`env`, `eval`, `inference`. `model` is the architecture only (what the weights mean: a restore
checks it and nothing else); `execution` is how the model is computed (dtypes, low precision,
remat, MoE dispatch, attention blocking), which a run may change between restarts.
Every section is a frozen dataclass whose fields are plain scalars, str-valued enums or tuples, so
that `launch.py --set a.b=v` can type-check overrides (see `composer_jax.overrides`) and the resolved
config serialises to `config.json` and back losslessly.

The `env` and `data` sections live beside the code that uses them (`composer_jax/env/config.py`,
`composer_jax/data/config.py`) so an environment worker can import its config without JAX; this
module composes them. Nothing here imports JAX.
"""
from __future__ import annotations

import dataclasses
import enum
import math

from composer_jax.data.config import DataConfig
from composer_jax.env.config import EnvConfig
from composer_jax.errors import ConfigError


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def _coerce_enums(obj, section: str) -> None:
    """Lets enum fields be given by value (e.g. dataclasses.replace(cfg, precision="mxfp8"))."""
    import typing
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        typ, value = hints[f.name], getattr(obj, f.name)
        if isinstance(typ, type) and issubclass(typ, enum.Enum) and not isinstance(value, typ):
            try:
                object.__setattr__(obj, f.name, typ(value))
            except ValueError:
                raise ConfigError(f"{section}.{f.name}: {value!r} is not one of "
                                  f"{[m.value for m in typ]}") from None


# ----------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------


class ScoringFunc(str, enum.Enum):
    """How router logits become expert scores."""
    SIGMOID = "sigmoid"   # DeepSeek-V3 / Kimi K2
    SOFTMAX = "softmax"   # DeepSeek-V2 style


class MoEImpl(str, enum.Enum):
    """How tokens reach their experts."""
    RAGGED = "ragged"     # dropless sort-by-expert + jax.lax.ragged_dot (default)
    DENSE = "dense"       # one-hot reference: every expert sees every token (tests only)


class RopeScaling(str, enum.Enum):
    NONE = "none"
    YARN = "yarn"


class Remat(str, enum.Enum):
    """Rematerialisation policy of each scanned block."""
    NONE = "none"                   # keep every activation
    FULL = "full"                   # recompute the whole block in the backward pass
    DOTS = "dots"                   # save matmul outputs, recompute the rest
    DOTS_NO_BATCH = "dots_no_batch" # save matmuls without batch dims (weights-stationary)


class Precision(str, enum.Enum):
    """Number format of the model's dense and expert matmuls (see composer_jax.quant)."""
    BF16 = "bf16"
    MXFP8 = "mxfp8"
    NVFP4 = "nvfp4"


class DType(str, enum.Enum):
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding of the decoupled 64-dim (qk_rope_head_dim) part of q and k.

    `interleaved=True` rotates adjacent pairs (x0, x1), (x2, x3), ... (the DeepSeek checkpoint layout,
    HF `rope_interleave=True`); False rotates (x_i, x_{i + d/2}) (HF's `rotate_half`).
    YaRN fields follow HF's `rope_scaling` keys; `mscale_all_dim > 0` multiplies the softmax scale by
    yarn_mscale(factor, mscale_all_dim)^2 as DeepSeek-V3 does.
    """
    theta: float = 10000.0
    scaling: RopeScaling = RopeScaling.NONE
    factor: float = 1.0
    original_max_position: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
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
    name: str = "custom"
    vocab_size: int = 256
    hidden_size: int = 64
    num_layers: int = 2
    first_k_dense: int = 1
    dense_intermediate_size: int = 128
    moe_intermediate_size: int = 32
    num_routed_experts: int = 8
    num_shared_experts: int = 1
    num_experts_per_tok: int = 2
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 2.5
    scoring: ScoringFunc = ScoringFunc.SIGMOID
    norm_topk_prob: bool = True
    num_heads: int = 4
    q_lora_rank: int = 32
    kv_lora_rank: int = 16
    qk_nope_head_dim: int = 16
    qk_rope_head_dim: int = 8
    v_head_dim: int = 16
    rope: RopeConfig = RopeConfig()
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-6
    mtp_depth: int = 1

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


# ----------------------------------------------------------------------------------------------
# Execution (how the model is computed; `--set execution.remat=full`)
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ExecutionConfig:
    """How the model is computed: none of it changes what the weights mean, so a run may resume,
    or a checkpoint be sampled, with other values.

    param_dtype: dtype the forward holds the weights in (the TrainState keeps train.master_dtype
    when set); compute_dtype: activations and matmul inputs (accumulation is float32);
    precision: number format of the FFN/expert matmuls (composer_jax.quant);
    quant_bf16_last_blocks: with low precision, the last N transformer blocks (and MTP) stay BF16;
    remat: rematerialisation policy of each scanned block; moe_impl: local MoE dispatch;
    moe_capacity_factor: expert-parallel dispatch, 0 = dropless, > 0 = drop the overflow;
    attention_kv_block: key ranges longer than this use blocked online-softmax attention.
    The model modules read it from their forward context (`composer_jax.model.layers.Ctx`).
    """
    param_dtype: DType = DType.FLOAT32
    compute_dtype: DType = DType.FLOAT32
    precision: Precision = Precision.BF16
    quant_bf16_last_blocks: int = 0
    remat: Remat = Remat.NONE
    moe_impl: MoEImpl = MoEImpl.RAGGED
    moe_capacity_factor: float = 0.0
    attention_kv_block: int = 2048

    def __post_init__(self):
        _coerce_enums(self, "execution")
        p = "execution."
        _check(self.quant_bf16_last_blocks >= 0,
               f"{p}quant_bf16_last_blocks must be >= 0, got {self.quant_bf16_last_blocks}")
        _check(self.moe_capacity_factor >= 0,
               f"{p}moe_capacity_factor must be >= 0 (0 = dropless), got {self.moe_capacity_factor}")
        _check(self.attention_kv_block >= 1,
               f"{p}attention_kv_block must be >= 1, got {self.attention_kv_block}")

    def check_model(self, model: ModelConfig) -> None:
        """Raises ConfigError when a field does not fit `model` (quant_bf16_last_blocks)."""
        _check(self.quant_bf16_last_blocks <= model.num_layers,
               f"execution.quant_bf16_last_blocks must be in [0, model.num_layers="
               f"{model.num_layers}], got {self.quant_bf16_last_blocks}")


def bf16() -> ExecutionConfig:
    """BF16 weights and activations (the large presets' training and serving setting)."""
    return ExecutionConfig(param_dtype=DType.BFLOAT16, compute_dtype=DType.BFLOAT16)


EXECUTION_PRESETS = {"fp32": ExecutionConfig, "bf16": bf16}
# The execution a model preset is meant to run with when a Config is made from its name alone
# (`composer_jax.api.make_config("kimi_k2_5")`); presets not named here use ExecutionConfig().
MODEL_PRESET_EXECUTION = {"kimi_k2_5": bf16, "deepseek_v3": bf16}


# Keys that moved out of `model` (old config.json files and old `--set model.KEY=...` spellings):
# model.KEY -> SECTION.KEY.
MOVED_MODEL_KEYS = {
    "remat": "execution", "precision": "execution", "moe_impl": "execution",
    "attention_kv_block": "execution", "moe_capacity_factor": "execution",
    "quant_bf16_last_blocks": "execution", "param_dtype": "execution",
    "compute_dtype": "execution", "router_bias_update_rate": "train",
    "seq_aux_loss_coef": "train", "init_std": "train"}


def split_legacy_model(model: dict) -> tuple[dict, dict[str, dict]]:
    """A model section dict in the old layout -> (architecture dict, {section: moved fields})."""
    arch = {k: v for k, v in model.items() if k not in MOVED_MODEL_KEYS}
    moved: dict[str, dict] = {}
    for k, v in model.items():
        if k in MOVED_MODEL_KEYS:
            moved.setdefault(MOVED_MODEL_KEYS[k], {})[k] = v
    return arch, moved


def migrate_legacy_config(d: dict) -> dict:
    """A Config dict (config.json) written before the `execution` section existed, in today's
    layout: model.remat etc. move to `execution`, model.router_bias_update_rate,
    seq_aux_loss_coef and init_std to `train` (a value already in the new place wins).
    Dicts in today's layout come back unchanged."""
    if not isinstance(d.get("model"), dict) or not set(d["model"]) & set(MOVED_MODEL_KEYS):
        return d
    arch, moved = split_legacy_model(d["model"])
    out = dict(d, model=arch)
    for section, fields in moved.items():
        out[section] = {**fields, **(d.get(section) or {})}
    return out


# ----------------------------------------------------------------------------------------------
# Mesh
# ----------------------------------------------------------------------------------------------


MESH_AXES = ("data", "fsdp", "expert", "context", "tensor")


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Sizes of the named mesh axes; at most one may be -1 (filled from the device count).

    `rules` names a preset of the logical-axis -> mesh-axis rules table (composer_jax.parallel).
    `dcn_*` give the sizes of each axis across slices/hosts over the slow network (1 = all ICI).
    """
    data: int = 1
    fsdp: int = -1
    expert: int = 1
    context: int = 1
    tensor: int = 1
    dcn_data: int = 1
    dcn_fsdp: int = 1
    rules: str = "fsdp"
    num_devices: int = 0   # 0 = all visible devices; > 0 with --dry_run makes a virtual mesh
    cp_attention: str = "allgather"   # context-parallel attention: "allgather" (MLA latent) | "ring"
    axis_type: str = "auto"           # "auto" (GSPMD propagation) | "explicit" (sharding in types)

    def __post_init__(self):
        _coerce_enums(self, "mesh")
        sizes = self.axis_sizes()
        autos = [a for a, s in sizes.items() if s == -1]
        _check(len(autos) <= 1, f"mesh: at most one axis may be -1 (auto), got {autos}")
        for a, s in sizes.items():
            _check(s == -1 or s >= 1, f"mesh.{a} must be >= 1 or -1 (auto), got {s}")
        _check(self.dcn_data >= 1 and self.dcn_fsdp >= 1, "mesh.dcn_* must be >= 1")
        _check(self.num_devices >= 0, f"mesh.num_devices must be >= 0, got {self.num_devices}")
        _check(self.rules in ("fsdp", "ep_fsdp", "cp_ep"),
               f"mesh.rules: unknown preset {self.rules!r}; choose one of fsdp, ep_fsdp, cp_ep")
        _check(self.cp_attention in ("allgather", "ring"),
               f"mesh.cp_attention must be 'allgather' or 'ring', got {self.cp_attention!r}")
        _check(self.axis_type in ("auto", "explicit"),
               f"mesh.axis_type must be 'auto' or 'explicit', got {self.axis_type!r}")

    def axis_sizes(self) -> dict[str, int]:
        return {a: getattr(self, a) for a in MESH_AXES}

    def resolved(self, num_devices: int) -> dict[str, int]:
        """Axis sizes with the -1 axis filled so their product is `num_devices`."""
        sizes = self.axis_sizes()
        fixed = math.prod(s for s in sizes.values() if s != -1)
        auto = [a for a, s in sizes.items() if s == -1]
        if auto:
            _check(num_devices % fixed == 0,
                   f"mesh: {num_devices} devices are not divisible by the fixed axes "
                   f"{ {a: s for a, s in sizes.items() if s != -1} } (product {fixed})")
            sizes[auto[0]] = num_devices // fixed
        _check(math.prod(sizes.values()) == num_devices,
               f"mesh: axis sizes {sizes} multiply to {math.prod(sizes.values())}, "
               f"but there are {num_devices} devices")
        return sizes


# ----------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------


class Optimizer(str, enum.Enum):
    ADAMW = "adamw"
    MUON = "muon"     # Muon on 2-D matrices, AdamW on the rest


class Schedule(str, enum.Enum):
    COSINE = "cosine"     # linear warmup + cosine decay to min_lr_ratio * lr
    WSD = "wsd"           # warmup, stable, then linear decay over the last decay_fraction
    CONSTANT = "constant"


class MTPLoss(str, enum.Enum):
    SUPERVISED = "supervised"         # CE against the token k steps ahead
    SELF_DISTILL = "self_distill"     # KL towards the stop-gradient main head's distribution


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Optimisation and loop settings (sequence length and global batch live in `data`)."""
    steps: int = 100
    microbatches: int = 1          # gradient accumulation: data.global_batch_size is split in this many
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 10
    schedule: Schedule = Schedule.COSINE
    decay_fraction: float = 0.2
    optimizer: Optimizer = Optimizer.ADAMW
    b1: float = 0.9
    b2: float = 0.95
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    mtp_loss: MTPLoss = MTPLoss.SUPERVISED
    mtp_lambda: float = 0.3
    z_loss: float = 0.0
    max_nonfinite_steps: int = 5
    log_every: int = 10
    eval_every: int = 50
    eval_batches: int = 4
    checkpoint_every: int = 100
    keep_checkpoints: int = 3
    init_from: str = ""            # checkpoint dir or HF dir to start from ("" = random init)
    init_std: float = 0.02         # std of the normal init of a fresh model's weights
    loss: str = "lm"               # a registered loss (composer_jax.train.loss_api.get_loss)
    router_bias_update_rate: float = 1e-3   # aux-loss-free balancing: bias += rate * sign(...)
    seq_aux_loss_coef: float = 0.0          # sequence-wise balance loss weight (0 = off)
    # Master weights: "" keeps the parameters (and the microbatch gradient accumulator) in
    # execution.param_dtype; "float32" keeps an fp32 master copy and accumulates gradients in
    # fp32, while the forward runs on an execution.param_dtype copy (updates below |w|/256 survive).
    master_dtype: str = ""
    # --- tracking and profiling (issue 20) ---
    profile_steps: tuple[int, ...] = ()   # jax.profiler trace of these steps -> WORKDIR/profile/
    wandb_project: str = ""        # "" = no Weights & Biases run; else log metrics to this project
    wandb_mode: str = "online"     # "online" | "offline" (wandb sync later) | "disabled"
    compilation_cache: bool = True  # JAX persistent compilation cache under <cache dir>/jax_compilation

    def __post_init__(self):
        _coerce_enums(self, "train")
        _check(self.master_dtype in ("", "float32"),
               f"train.master_dtype must be '' (= execution.param_dtype) or 'float32', got "
               f"{self.master_dtype!r}")
        _check(bool(self.loss), "train.loss must name a registered loss (e.g. 'lm')")
        p = "train."
        for f in ("steps", "microbatches", "log_every", "eval_every",
                  "checkpoint_every", "keep_checkpoints", "max_nonfinite_steps"):
            _check(getattr(self, f) >= 1, f"{p}{f} must be >= 1, got {getattr(self, f)}")
        _check(self.lr > 0, f"{p}lr must be > 0, got {self.lr}")
        _check(0 <= self.min_lr_ratio <= 1, f"{p}min_lr_ratio must be in [0, 1]")
        _check(0 <= self.warmup_steps <= self.steps, f"{p}warmup_steps must be in [0, steps]")
        _check(0 < self.decay_fraction <= 1, f"{p}decay_fraction must be in (0, 1]")
        _check(self.mtp_lambda >= 0 and self.z_loss >= 0 and self.weight_decay >= 0,
               f"{p}mtp_lambda, z_loss and weight_decay must be >= 0")
        _check(self.grad_clip >= 0, f"{p}grad_clip must be >= 0 (0 = off)")
        _check(self.init_std > 0, f"{p}init_std must be > 0, got {self.init_std}")
        _check(self.router_bias_update_rate >= 0, f"{p}router_bias_update_rate must be >= 0")
        _check(self.seq_aux_loss_coef >= 0, f"{p}seq_aux_loss_coef must be >= 0 (0 = off)")
        _check(all(s >= 0 for s in self.profile_steps),
               f"{p}profile_steps must be step numbers >= 0, got {self.profile_steps}")
        _check(self.wandb_mode in ("online", "offline", "disabled"),
               f"{p}wandb_mode must be 'online', 'offline' or 'disabled', got {self.wandb_mode!r}")


# ----------------------------------------------------------------------------------------------
# RL and evaluation
# ----------------------------------------------------------------------------------------------


class PolicyLoss(str, enum.Enum):
    TRUNCATED_IS = "truncated_is"   # REINFORCE with truncated importance weights (default)
    PPO_CLIP = "ppo_clip"


class RLBackend(str, enum.Enum):
    LOCAL = "local"      # one machine: rollout workers as threads or processes, no server
    RAY = "ray"          # the same services as Ray actors (a local cluster or rl.ray_address)


class WorkerMode(str, enum.Enum):
    THREAD = "thread"
    PROCESS = "process"  # JAX-free processes; a dead one is replaced


class RLTasks(str, enum.Enum):
    PARITY = "parity"    # the known-optimum task family of composer_jax.rl.toy_tasks
    CODING = "coding"    # sandboxed coding tasks of the env task pool (token-level agent)


@dataclasses.dataclass(frozen=True)
class RLConfig:
    """Asynchronous policy-gradient RL (DESIGN.md "Asynchronous RL"). The concave length/effort
    penalty is a reward term, configured with the other rewards in `env.reward_length_*`."""
    group_size: int = 4                 # samples per task; advantage = R - group mean
    loss: PolicyLoss = PolicyLoss.TRUNCATED_IS
    is_truncation: float = 2.0          # cap on the behaviour importance ratio
    clip_eps: float = 0.2               # PPO clipping (loss=ppo_clip)
    loss_normalizer: float = 4096.0     # token sums are divided by this constant (Dr.GRPO)
    kl_coef: float = 0.0                # k1 KL penalty placed in the reward
    max_staleness: int = 4              # admission control: versions ahead of the trainer
    full_snapshot_every: int = 10       # weight sync: a full snapshot every K versions
    weight_sync_dtype: str = "bfloat16"           # the shipped inference copy ("" = as trained)
    weight_sync_keep_dtype: tuple[str, ...] = ("*bias",)  # names shipped in their own dtype
    weight_sync_chunk_elems: int = 1 << 20        # delta/snapshot chunk size (elements)
    weight_sync_codec: str = "sparse"             # delta codec: sparse (positions + XOR) | xor
    weight_sync_zstd_level: int = 3
    weight_sync_threads: int = 0                  # encode/decode threads (0 = min(8, cpus))
    # --- the update step (issue 15: composer_jax.rl.step) ---
    router_replay: bool = True          # the trainer's forward reuses the experts chosen at sampling
    summary_trigger_tokens: int = 0     # self-summarization when the context passes this (0 = off)
    # --- the rl_async / rl_sync job (issue 17: composer_jax.rl.driver, experiments/rl.py) ---
    backend: RLBackend = RLBackend.LOCAL     # local: threads/processes here | ray: Ray actors
    ray_address: str = ""               # backend=ray: "" starts a local Ray cluster in the run
    worker_mode: WorkerMode = WorkerMode.THREAD   # local backend: rollout workers as threads|processes
    num_rollout_workers: int = 8        # concurrent episodes
    batch_groups: int = 4               # B: groups (of group_size samples) per trainer step
    steps: int = 40                     # trainer versions to reach
    checkpoint_every: int = 5           # trainer state + consumed rollout ids, every N versions
    eval_every: int = 10                # held-out evaluation every N versions (0 = off)
    tasks: RLTasks = RLTasks.PARITY     # parity: known-optimum family | coding: the env task pool
    num_train_tasks: int = 64
    num_eval_tasks: int = 16
    max_new_tokens: int = 8             # per assistant turn
    temperature: float = 1.0            # sampling temperature of training episodes (eval: greedy)
    seq_len: int = 64                   # trainer row length (tokens)
    parity_kinds: tuple[str, ...] = ("even", "odd")   # tasks=parity: ("even",) = unconditional
    env_latency_scale: float = 0.0      # tasks=parity: x measured sandbox episode times (rl/latency_model.py; 0 = off)
    init_from: str = ""                 # tasks=coding: policy checkpoint (workdir); "" = the cached `sft` run

    def __post_init__(self):
        _coerce_enums(self, "rl")
        _check(self.group_size >= 1, "rl.group_size must be >= 1")
        _check(self.is_truncation >= 1, "rl.is_truncation must be >= 1")
        _check(0 < self.clip_eps < 1, "rl.clip_eps must be in (0, 1)")
        _check(self.loss_normalizer > 0, "rl.loss_normalizer must be > 0")
        _check(self.max_staleness >= 0, "rl.max_staleness must be >= 0")
        _check(self.full_snapshot_every >= 1, "rl.full_snapshot_every must be >= 1")
        _check(self.weight_sync_codec in ("sparse", "xor"),
               f"rl.weight_sync_codec must be 'sparse' or 'xor', got {self.weight_sync_codec!r}")
        _check(self.weight_sync_chunk_elems >= 1 and self.weight_sync_threads >= 0
               and 1 <= self.weight_sync_zstd_level <= 22,
               "rl.weight_sync_chunk_elems must be >= 1, rl.weight_sync_threads >= 0 and "
               "rl.weight_sync_zstd_level in [1, 22]")
        _check(self.kl_coef >= 0, f"rl.kl_coef must be >= 0 (0 = no reference policy), got {self.kl_coef}")
        _check(self.summary_trigger_tokens >= 0,
               f"rl.summary_trigger_tokens must be >= 0 (0 = off), got {self.summary_trigger_tokens}")
        for f in ("num_rollout_workers", "batch_groups", "steps", "checkpoint_every",
                  "num_train_tasks", "num_eval_tasks", "max_new_tokens", "seq_len"):
            _check(getattr(self, f) >= 1, f"rl.{f} must be >= 1, got {getattr(self, f)}")
        _check(self.eval_every >= 0, f"rl.eval_every must be >= 0 (0 = off), got {self.eval_every}")
        _check(self.temperature >= 0, f"rl.temperature must be >= 0, got {self.temperature}")
        _check(self.env_latency_scale >= 0,
               f"rl.env_latency_scale must be >= 0 (0 = off), got {self.env_latency_scale}")
        _check(bool(self.parity_kinds) and set(self.parity_kinds) <= {"even", "odd"},
               f"rl.parity_kinds must be a non-empty subset of (even, odd), got {self.parity_kinds}")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """The evaluation suite and runner (`composer_jax.eval`, `launch.py --experiment=eval`).

    policy: oracle | null | heuristic | a training run's workdir | a Hugging Face directory.
    num_tasks: run only the first N suite tasks; samples: K episodes per task and prompt style
    (pass@k); styles: prompt styles scored (terse, detailed). concurrency: episodes at once (for a
    model, also the engine's decode slots; >= samples x styles runs a task's samples together);
    max_context: a model episode's context (the engine's max_len). suite_dir / pool_dir: "" =
    under the cache (`<cache>/eval_suite/<name>-<size>-<pool key>-<builder hash>`,
    `<cache>/eval_pool/<pool key>`; the pool key hashes the task generators' code). price_*:
    dollars per million prompt / cached-prompt / generated tokens. compare: eval.json files for
    `eval_compare`."""
    num_tasks: int = 50
    max_turns: int = 80
    max_new_tokens: int = 512
    temperature: float = 0.0
    policy: str = "oracle"
    samples: int = 1
    styles: tuple[str, ...] = ("terse", "detailed")
    concurrency: int = 2
    max_context: int = 8192
    suite_name: str = "cjbench"
    suite_dir: str = ""
    pool_dir: str = ""
    suite_size: int = 20
    min_median_lines: int = 50
    pool_tasks: int = 120
    price_prompt_per_mtok: float = 0.5
    price_cached_per_mtok: float = 0.05
    price_generated_per_mtok: float = 2.5
    compare: tuple[str, ...] = ()

    def __post_init__(self):
        _check(self.num_tasks >= 1 and self.max_turns >= 1 and self.max_new_tokens >= 1,
               "eval.num_tasks, eval.max_turns and eval.max_new_tokens must be >= 1")
        _check(self.temperature >= 0, "eval.temperature must be >= 0")
        _check(self.samples >= 1 and self.concurrency >= 1 and self.suite_size >= 1
               and self.pool_tasks >= 1, "eval.samples, eval.concurrency, eval.suite_size and "
               "eval.pool_tasks must be >= 1")
        _check(len(self.styles) >= 1 and all(s in ("terse", "detailed") for s in self.styles)
               and len(set(self.styles)) == len(self.styles),
               f"eval.styles must be a non-empty subset of (terse, detailed), got {self.styles}")
        _check(self.max_context > self.max_new_tokens,
               "eval.max_context must be larger than eval.max_new_tokens")
        _check(min(self.price_prompt_per_mtok, self.price_cached_per_mtok,
                   self.price_generated_per_mtok) >= 0, "eval.price_* must be >= 0")
        _check(bool(self.policy), "eval.policy must be oracle, null, heuristic or a directory")


# ----------------------------------------------------------------------------------------------
# Inference (the engine's knobs; `--set inference.max_batch=...`)
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """max_batch: decode slots (continuous batching); max_len: context per slot (cache length);
    max_queue: requests waiting for a slot before `submit` refuses more; spec_depth: MTP drafts
    per step (0 = plain decoding; <= the model's mtp_depth); capture_router: return the routed
    experts of every token; reprefill_on_swap: rebuild caches with the new weights on a weight
    swap (default: keep them); prefill_batch: rows per prefill call (requests admitted together
    are prefilled in groups of this many, padded); min_prefill_bucket: smallest padded prefill length (chunks are
    padded to powers of two so each length compiles once); seed: the engine's base PRNG seed;
    max_finished: finished completions kept in `Engine.completions` for lookup (the oldest are
    pruned first; `Engine.wait` collects one at once; futures keep their own result)."""
    max_batch: int = 8
    max_len: int = 1024
    max_queue: int = 256
    spec_depth: int = 0
    capture_router: bool = False
    reprefill_on_swap: bool = False
    prefill_batch: int = 1
    min_prefill_bucket: int = 16
    seed: int = 0
    max_finished: int = 4096

    def __post_init__(self):
        for f in ("max_batch", "max_len", "max_queue", "prefill_batch", "min_prefill_bucket",
                  "max_finished"):
            if getattr(self, f) < 1:
                raise ConfigError(f"inference.{f} must be >= 1, got {getattr(self, f)}")
        if self.spec_depth < 0:
            raise ConfigError(f"inference.spec_depth must be >= 0, got {self.spec_depth}")


# ----------------------------------------------------------------------------------------------
# The whole config
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Config:
    model: ModelConfig = dataclasses.field(default_factory=tiny)
    execution: ExecutionConfig = ExecutionConfig()
    mesh: MeshConfig = MeshConfig()
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    train: TrainConfig = TrainConfig()
    rl: RLConfig = RLConfig()
    env: EnvConfig = dataclasses.field(default_factory=EnvConfig)
    eval: EvalConfig = EvalConfig()
    inference: EngineConfig = EngineConfig()
    seed: int = 0

    def __post_init__(self):
        _check(self.data.global_batch_size % self.train.microbatches == 0,
               f"train.microbatches={self.train.microbatches} must divide data.global_batch_size="
               f"{self.data.global_batch_size}")
        _check(self.data.seq_len <= self.model.max_position_embeddings,
               f"data.seq_len={self.data.seq_len} exceeds model.max_position_embeddings="
               f"{self.model.max_position_embeddings}; shorten the sequences or raise the limit "
               f"(with model.rope scaling for context extension)")
        self.execution.check_model(self.model)
        if self.mesh.num_devices > 0:       # a fixed device count: the axes must multiply to it
            self.mesh.resolved(self.mesh.num_devices)


# Sections that `--set SECTION=PRESET` may replace wholesale.
SECTION_PRESETS = {"model": MODEL_PRESETS, "execution": EXECUTION_PRESETS}


def to_dict(cfg) -> dict:
    """A JSON-ready dict of a config (enums become their string values)."""
    def conv(v):
        if dataclasses.is_dataclass(v):
            return {f.name: conv(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, enum.Enum):
            return v.value
        if isinstance(v, tuple):
            return [conv(x) for x in v]
        return v
    return conv(cfg)


def from_dict(cls, d: dict):
    """Inverse of `to_dict` (validates, like every construction). A Config dict in the layout
    before the `execution` section is migrated first (`migrate_legacy_config`)."""
    from composer_jax.overrides import build_dataclass
    if cls is Config:
        d = migrate_legacy_config(d)
    return build_dataclass(cls, d)
