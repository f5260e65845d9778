"""The `rl` section: asynchronous policy-gradient RL (the update step and the rl_async job)."""
from __future__ import annotations

import dataclasses
import enum

from composer_jax.config.checks import _check, _coerce_enums


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
    LOOKUP = "lookup"    # multi-turn tool-using notes family of composer_jax.rl.lookup_tasks


class StalePolicy(str, enum.Enum):
    DROP = "drop"        # a group with a rollout older than rl.max_staleness is not trained
    KEEP = "keep"        # trained anyway, corrected by the truncated importance weights


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
    stale_policy: StalePolicy = StalePolicy.DROP   # at consumption, a group older than max_staleness
    error_penalty: float = 1.0          # an error rollout with trainable tokens gets reward -error_penalty
    max_turns: int = 4                  # tasks=lookup: assistant turns per episode
    lookup_levels: tuple[str, ...] = ("easy",)     # tasks=lookup: easy (read, finish) / hard (read x2)
    lookup_sft_steps: int = 40          # tasks=lookup: SFT steps of the initial policy (0 = fresh)
    lookup_sft_hasty: float = 0.25      # tasks=lookup: fraction of SFT demos that guess without reading
    lookup_sft_seed: int = 0            # tasks=lookup: seed of the SFT (init + demos), shared by RL seeds
    eval_greedy: bool = True            # held-out episodes greedy; False: sampled at rl.temperature
                                        # with a fixed seed per (version, task)
    lookup_length_weights: tuple[float, ...] = (1.0, 0.0)  # length-term scale of (easy, hard)

    def __post_init__(self):
        _coerce_enums(self, "rl")
        _check(self.group_size >= 2,
               f"rl.group_size={self.group_size}: advantages are group-relative (reward minus the "
               f"mean of the task's group), so a group of one has advantage 0 and no gradient; "
               f"use rl.group_size >= 2")
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
        _check(self.max_new_tokens < self.seq_len,
               f"rl.max_new_tokens={self.max_new_tokens} must be < rl.seq_len={self.seq_len}: a "
               f"trainer row holds the prompt and the reply")
        _check(self.eval_every >= 0, f"rl.eval_every must be >= 0 (0 = off), got {self.eval_every}")
        _check(self.temperature >= 0, f"rl.temperature must be >= 0, got {self.temperature}")
        _check(self.env_latency_scale >= 0,
               f"rl.env_latency_scale must be >= 0 (0 = off), got {self.env_latency_scale}")
        _check(0 <= self.lookup_sft_hasty <= 1,
               f"rl.lookup_sft_hasty must be in [0, 1], got {self.lookup_sft_hasty}")
        _check(self.error_penalty >= 0, f"rl.error_penalty must be >= 0, got {self.error_penalty}")
        _check(self.max_turns >= 1 and self.lookup_sft_steps >= 0,
               f"rl.max_turns must be >= 1 and rl.lookup_sft_steps >= 0, got {self.max_turns}, "
               f"{self.lookup_sft_steps}")
        _check(bool(self.lookup_levels) and set(self.lookup_levels) <= {"easy", "hard"},
               f"rl.lookup_levels must be a non-empty subset of (easy, hard), got {self.lookup_levels}")
        _check(len(self.lookup_length_weights) == 2 and min(self.lookup_length_weights) >= 0,
               f"rl.lookup_length_weights must be two weights >= 0 (easy, hard), got "
               f"{self.lookup_length_weights}")
        _check(bool(self.parity_kinds) and set(self.parity_kinds) <= {"even", "odd"},
               f"rl.parity_kinds must be a non-empty subset of (even, odd), got {self.parity_kinds}")
