"""Frozen, typed, validated configuration for every part of composer_jax.

One `Config` holds one section per subsystem: `model`, `execution`, `mesh`, `data`, `train`, `rl`,
`env`, `eval`, `inference`, `sweep`. `model` is the architecture only (what the weights mean: a restore
checks it and nothing else); `execution` is how the model is computed (dtypes, low precision,
remat, MoE dispatch, attention blocking), which a run may change between restarts.
Every section is a frozen dataclass whose fields are plain scalars, str-valued enums or tuples, so
that `launch.py --set a.b=v` can type-check overrides (see `composer_jax.overrides`) and the resolved
config serialises to `config.json` and back losslessly.

Nothing here imports JAX or any other part of composer_jax (but `errors`): config modules sit below
everything they configure, so an environment worker imports its config cheaply.

One module per section (`model`, `execution`, `mesh`, `data`, `env`, `train`, `rl`, `eval`,
`engine`), the validation helpers (`checks`), dict -> dataclass building (`build`) and the
old-layout migration (`legacy`); every public name is re-exported here, so
`from composer_jax.config import X` is the way to import any of them (the old paths
`composer_jax.data.config` and `composer_jax.env.config` re-export their sections).
"""
from __future__ import annotations

import dataclasses
import enum

from composer_jax.config.build import build_dataclass
from composer_jax.config.checks import _check
from composer_jax.config.engine import EngineConfig
from composer_jax.config.eval import EvalConfig
from composer_jax.config.execution import (EXECUTION_PRESETS, MODEL_PRESET_EXECUTION, DType,
                                           ExecutionConfig, MoEImpl, Precision, Remat, bf16)
from composer_jax.config.legacy import (MOVED_MODEL_KEYS, migrate_legacy_config,
                                        split_legacy_model)
from composer_jax.config.mesh import MESH_AXES, MeshConfig
from composer_jax.config.model import (MODEL_PRESETS, ModelConfig, RopeConfig, RopeScaling,
                                       ScoringFunc, deepseek_v3, kimi_k2_5, small, tiny)
from composer_jax.config.rl import (MOVED_RL_KEYS, TASK_PRESETS, CodingTaskConfig, JobConfig,
                                    LookupTaskConfig, ParityTaskConfig, PolicyLoss, RLBackend,
                                    RLConfig, RLSchedule, RLTasks, StalePolicy, TaskConfig, WeightSyncConfig,
                                    WorkerMode, register_task_config, task_config_class)
from composer_jax.config.sweep import SweepConfig
from composer_jax.config.train import MTPLoss, Optimizer, Schedule, TrainConfig
from composer_jax.config.data import DataConfig
from composer_jax.config.env import EnvConfig
from composer_jax.errors import ConfigError

__all__ = [
    "CodingTaskConfig", "Config", "ConfigError", "JobConfig", "LookupTaskConfig", "MOVED_RL_KEYS",
    "ParityTaskConfig", "RLSchedule", "StalePolicy",
    "TASK_PRESETS", "TaskConfig", "WeightSyncConfig", "register_task_config", "task_config_class", "DataConfig", "DType", "EngineConfig", "EnvConfig", "EvalConfig",
    "ExecutionConfig", "EXECUTION_PRESETS", "MESH_AXES", "MeshConfig", "MODEL_PRESETS",
    "MODEL_PRESET_EXECUTION", "MOVED_MODEL_KEYS", "MTPLoss", "MoEImpl", "ModelConfig",
    "Optimizer", "PolicyLoss", "Precision", "RLBackend", "RLConfig", "RLTasks", "Remat",
    "RopeConfig", "RopeScaling", "Schedule", "ScoringFunc", "SECTION_PRESETS", "SweepConfig",
    "TrainConfig",
    "WorkerMode", "bf16", "deepseek_v3", "from_dict", "kimi_k2_5", "migrate_legacy_config",
    "small", "split_legacy_model", "tiny", "to_dict"]


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
    sweep: SweepConfig = SweepConfig()
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
SECTION_PRESETS = {"model": MODEL_PRESETS, "execution": EXECUTION_PRESETS,
                   "rl": {"task": TASK_PRESETS}}


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
    if cls is Config:
        d = migrate_legacy_config(d)
    return build_dataclass(cls, d)
