"""The `train` section: optimisation and training-loop settings."""
from __future__ import annotations

import dataclasses
import enum

from composer_jax.config.checks import _check, _coerce_enums


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
    steps: int = 100                    # optimizer steps of the run
    microbatches: int = 1          # gradient accumulation: data.global_batch_size is split in this many
    lr: float = 1e-3                    # peak learning rate
    min_lr_ratio: float = 0.1           # the schedule decays to min_lr_ratio x lr
    warmup_steps: int = 10              # linear warmup steps
    schedule: Schedule = Schedule.COSINE  # cosine | wsd (warmup-stable-decay) | constant
    decay_fraction: float = 0.2         # wsd: fraction of the steps spent decaying
    optimizer: Optimizer = Optimizer.ADAMW  # adamw | muon (Muon on matrices, AdamW on the rest)
    b1: float = 0.9                     # Adam beta1
    b2: float = 0.95                    # Adam beta2
    weight_decay: float = 0.1           # decoupled weight decay
    grad_clip: float = 1.0              # global gradient-norm clip (0 = off)
    mtp_loss: MTPLoss = MTPLoss.SUPERVISED  # MTP heads' loss: supervised | self_distill
    mtp_lambda: float = 0.3             # weight of the MTP loss
    z_loss: float = 0.0                 # router/logit z-loss weight (0 = off)
    max_nonfinite_steps: int = 5        # consecutive non-finite steps skipped before the run stops
    log_every: int = 10                 # steps between metric rows
    eval_every: int = 50                # steps between validation evaluations
    eval_batches: int = 4               # validation batches per evaluation
    checkpoint_every: int = 100         # steps between checkpoints
    keep_checkpoints: int = 3           # checkpoints kept (older ones deleted)
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
    wandb_group: str = ""          # W&B run group ("" = none; a sweep's trials share the sweep's)
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
