"""The `execution` section: how the model is computed (dtypes, low precision, remat, MoE
dispatch, attention blocking); a run may change it between restarts."""
from __future__ import annotations

import dataclasses
import enum

from composer_jax.config.checks import _check, _coerce_enums
from composer_jax.config.model import ModelConfig


class MoEImpl(str, enum.Enum):
    """How tokens reach their experts."""
    RAGGED = "ragged"     # dropless sort-by-expert + jax.lax.ragged_dot (default)
    DENSE = "dense"       # one-hot reference: every expert sees every token (tests only)


class Remat(str, enum.Enum):
    """Rematerialisation policy of each scanned block (the named ones save the block's tagged
    matmul outputs, MaxText's names: composer_jax.model.transformer.REMAT_SAVED)."""
    NONE = "none"                   # keep every activation
    FULL = "full"                   # recompute the whole block in the backward pass
    DOTS = "dots"                   # save matmul outputs, recompute the rest
    DOTS_NO_BATCH = "dots_no_batch" # save matmuls without batch dims (weights-stationary)
    MINIMAL = "minimal"             # save q/kv/out projections and the FFN matmuls
    MINIMAL_WITH_CONTEXT = "minimal_with_context"   # minimal + the attention output
    SAVE_DOT_EXCEPT_MLP = "save_dot_except_mlp"     # projections only, recompute the FFN
    SAVE_DOT_EXCEPT_MLPWI = "save_dot_except_mlpwi" # projections and the FFN down matmul
    SAVE_QKV_PROJ = "save_qkv_proj"                 # q and kv projections only
    SAVE_OUT_PROJ = "save_out_proj"                 # the attention output projection only


class Precision(str, enum.Enum):
    """Number format of the model's dense and expert matmuls (see composer_jax.quant)."""
    BF16 = "bf16"
    MXFP8 = "mxfp8"
    NVFP4 = "nvfp4"


class DType(str, enum.Enum):
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"


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
