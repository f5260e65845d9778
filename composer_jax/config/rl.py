"""The `rl` section: asynchronous policy-gradient RL (the update step and the rl_async job).

    rl.*              the algorithm: group size, loss, staleness, sampling, sequence length, steps
    rl.task           the task family and its settings (`rl.task=NAME` picks a family's defaults;
                      `rl.task.KEY=VALUE` sets one of them); see `composer_jax.agent.tasks`
    rl.job            where and how the job runs (backend, workers, checkpoint/eval cadence)
    rl.weight_sync    how weight versions reach the inference service (rl/weights)

Each section validates itself once, on construction. Keys of the old flat layout
(`rl.weight_sync_dtype`, `rl.backend`, `rl.tasks`, ...) are rejected with the new key's name
(`MOVED_RL_KEYS`); old config.json files are migrated (`migrate_legacy_rl`).
"""
from __future__ import annotations

import dataclasses
import enum
import importlib

from composer_jax.config.checks import _check, _coerce_enums
from composer_jax.config.train import Schedule
from composer_jax.errors import ConfigError


class PolicyLoss(str, enum.Enum):
    TRUNCATED_IS = "truncated_is"   # REINFORCE with truncated importance weights (default)
    PPO_CLIP = "ppo_clip"


class RLBackend(str, enum.Enum):
    LOCAL = "local"      # one machine: rollout workers as threads or processes, no server
    RAY = "ray"          # the same services as Ray actors (a local cluster or rl.job.ray_address)


class WorkerMode(str, enum.Enum):
    THREAD = "thread"
    PROCESS = "process"  # JAX-free processes; a dead one is replaced


class RLTasks(str, enum.Enum):
    """The built-in task families (kept for old code; `rl.task.family` is any registered name)."""
    PARITY = "parity"    # the known-optimum task family (composer_jax.agent.tasks.parity)
    CODING = "coding"    # sandboxed coding tasks of the env task pool (token-level agent)
    LOOKUP = "lookup"    # multi-turn read_file/finish episodes over notes (composer_jax.agent.lookup)


class StalePolicy(str, enum.Enum):
    DROP = "drop"        # a group with a rollout older than rl.max_staleness is not trained
    KEEP = "keep"        # trained anyway, corrected by the truncated importance weights


class RLSchedule(str, enum.Enum):
    """How rollouts are scheduled against policy versions (`rl/schedule.py`)."""
    REPRODUCIBLE = "reproducible"  # group i sampled with version max(0, i//B - max_staleness) and
                                   # trained in index order: the same seed gives the same run
    FREE_RUNNING = "free_running"  # groups start when admission allows, sample with whatever
                                   # version is loaded and train in completion order (throughput)


class LadderKeywords(str, enum.Enum):
    """Which level-1 keyword sites the ladder makes (`env.tasks.ladder_sites`): ANY (every CPython;
    before 3.13 the TypeError names the misspelt keyword only) or HINTED (3.13+ tasks whose
    TypeError also carries CPython's "Did you mean 'key'?", like names and attributes)."""
    ANY = "any"
    HINTED = "hinted"


class BehaviourReward(str, enum.Enum):
    """Where the reward's behaviour terms (valid/invalid calls, length, communication) rank a
    group's episodes (`rl/trained_reward.py`): EVERY_GROUP, or RESOLVED_GROUPS only (in a group
    where no episode resolved they are left out, so a shorter failure never outranks a longer
    one; integrity terms count in every group)."""
    EVERY_GROUP = "every_group"
    RESOLVED_GROUPS = "resolved_groups"


class ResumeMode(str, enum.Enum):
    """How a resumed episode rebuilds its engine session (`agent.episode_checkpoint`)."""
    PREFILL = "prefill"  # one prefill of the recorded prefix (cheap; next log-probs within fp32
                         # rounding of an uninterrupted run's)
    REPLAY = "replay"    # the recorded turns again, sampled ids forced through decode (as much
                         # engine work as the turns took; bit-exact with the same weights)


# ---------------------------------------------------------------------------------------------
# rl.task: one section class per task family
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """Base of every task family's section `rl.task`: `family` names the family (its registered
    name, or a module path `pkg.module` whose import registers it); a family adds its own fields
    in a subclass registered with `register_task_config`."""
    family: str = "parity"  # the task family (a registered name or a plug-in module path)
    num_train_tasks: int = 64           # training tasks of the family
    num_eval_tasks: int = 16            # held-out evaluation tasks of the family

    def __post_init__(self):
        _coerce_enums(self, "rl.task")
        for f in ("num_train_tasks", "num_eval_tasks"):
            _check(getattr(self, f) >= 1, f"rl.task.{f} must be >= 1, got {getattr(self, f)}")
        want = _TASK_CONFIGS.get(self.family)
        _check(want is None or isinstance(self, want),
               f"rl.task.family={self.family!r} needs the section class {getattr(want, '__name__', '')}"
               f", got {type(self).__name__}; select a family with --set rl.task={self.family}")

    @classmethod
    def section_class(cls, d: dict) -> type:
        """The section class of the family a dict names (`family`; default parity)."""
        return task_config_class(d.get("family", cls.family) if d else cls.family)


@dataclasses.dataclass(frozen=True)
class ParityTaskConfig(TaskConfig):
    """rl.task=parity: kinds ("even",) is the unconditional variant; env_latency_scale > 0 adds
    modelled sandbox time to each episode (x measured episode times, rl/latency_model.py)."""
    family: str = "parity"
    kinds: tuple[str, ...] = ("even", "odd")
    env_latency_scale: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        _check(bool(self.kinds) and set(self.kinds) <= {"even", "odd"},
               f"rl.task.kinds must be a non-empty subset of (even, odd), got {self.kinds}")
        _check(self.env_latency_scale >= 0,
               f"rl.task.env_latency_scale must be >= 0 (0 = off), got {self.env_latency_scale}")


@dataclasses.dataclass(frozen=True)
class CodingTaskConfig(TaskConfig):
    """rl.task=coding: the env task pool's sandboxed episodes; init_from: the initial policy (a
    run workdir; "" = the cached `sft` run built from the pool); tokenizer: a tokenizer.json
    ("" = the one in init_from).

    Difficulty ladder (`composer_jax.env.tasks.ladder_generate`): levels: () = the pool of
    env.kinds (level 3 and up: bug, feature, ...); (1,), (2,) or (1, 2) = the ladder pool's tasks
    of those levels (1: one misspelt name/attribute/keyword on the line the traceback names, with
    CPython's "Did you mean" hint; 2: one wrong operator/constant/boundary on a line no traceback
    names), trained on training modules and scored on held-out modules of the same levels;
    ladder_train / ladder_heldout: tasks per level generated from training / held-out modules;
    split_seed / heldout_fraction: the module split (`env.tasks.ladder_split`: heldout.py's
    modules plus that fraction of the others, by a hash of the seed and the top-level name; the
    default 0 holds out heldout.py's modules only, which the pretraining corpus also lacks);
    ladder_pythons: CPython versions of the ladder's tasks (() = every installed 3.8+);
    ladder_keywords: which level-1 keyword sites (`LadderKeywords`: any, or hinted only).
    train_tasks_file: a text file of training task ids, one per line ('#' starts a comment; e.g.
    the tasks an earlier policy resolved sometimes but not always, written by
    `benchmarks/rl_coding_ladder.py --pass_rates`): train on those only, in place of the first
    num_train_tasks; each must be a training task of the pool ("" = off)."""
    family: str = "coding"
    init_from: str = ""
    tokenizer: str = ""
    levels: tuple[int, ...] = ()
    ladder_train: int = 200
    ladder_heldout: int = 60
    split_seed: int = 0
    heldout_fraction: float = 0.0
    ladder_pythons: tuple[str, ...] = ()
    ladder_keywords: LadderKeywords = LadderKeywords.ANY
    train_tasks_file: str = ""

    def __post_init__(self):
        super().__post_init__()
        _check(set(self.levels) <= {1, 2} and len(set(self.levels)) == len(self.levels),
               f"rl.task.levels must be distinct ladder levels among (1, 2) (level 3 and up = "
               f"the env.kinds pool: leave rl.task.levels empty), got {self.levels}")
        _check(self.ladder_train >= 1 and self.ladder_heldout >= 1,
               f"rl.task.ladder_train and rl.task.ladder_heldout must be >= 1, got "
               f"{self.ladder_train}, {self.ladder_heldout}")
        _check(0 <= self.heldout_fraction < 1,
               f"rl.task.heldout_fraction must be in [0, 1), got {self.heldout_fraction}")


@dataclasses.dataclass(frozen=True)
class LookupTaskConfig(TaskConfig):
    """rl.task=lookup: multi-turn read_file/finish episodes over a task's notes, held-out prompt
    keys never trained on (`composer_jax.agent.lookup`). max_turns: assistant turns per episode;
    levels: easy (read, finish) and/or hard (read twice, finish); sft_steps: SFT steps of the
    initial policy on training demonstrations (0 = a fresh model); length_weights: the length
    term's scale on (easy, hard) tasks (difficulty-aware effort); sft_hasty: the fraction of SFT
    demonstrations that guess a code without reading (finish at once, claiming success);
    sft_seed: the seed of the SFT (its init, training tasks and demonstrations), so runs of
    every seed share one initial policy; sft_lr, sft_schedule: the SFT's Adam peak rate and
    schedule (COSINE decays to 0 over sft_steps, so the last steps settle the weights instead of
    leaving them where float noise put them; CONSTANT keeps the rate)."""
    family: str = "lookup"
    max_turns: int = 4
    levels: tuple[str, ...] = ("easy",)
    sft_steps: int = 40
    sft_hasty: float = 0.25
    sft_seed: int = 0
    sft_lr: float = 3e-3
    sft_schedule: Schedule = Schedule.CONSTANT
    length_weights: tuple[float, ...] = (1.0, 0.0)

    def __post_init__(self):
        super().__post_init__()
        _check(self.max_turns >= 1 and self.sft_steps >= 0,
               f"rl.task.max_turns must be >= 1 and rl.task.sft_steps >= 0, got "
               f"{self.max_turns}, {self.sft_steps}")
        _check(bool(self.levels) and set(self.levels) <= {"easy", "hard"},
               f"rl.task.levels must be a non-empty subset of (easy, hard), got {self.levels}")
        _check(0 <= self.sft_hasty <= 1,
               f"rl.task.sft_hasty must be in [0, 1], got {self.sft_hasty}")
        _check(self.sft_lr > 0, f"rl.task.sft_lr must be > 0, got {self.sft_lr}")
        _check(len(self.length_weights) == 2 and min(self.length_weights) >= 0,
               f"rl.task.length_weights must be two weights >= 0 (easy, hard), got "
               f"{self.length_weights}")


_TASK_CONFIGS: dict[str, type[TaskConfig]] = {"parity": ParityTaskConfig,
                                              "coding": CodingTaskConfig,
                                              "lookup": LookupTaskConfig}


def register_task_config(name: str, cls: type[TaskConfig]) -> None:
    """Registers the section class of task family `name` (a subclass of TaskConfig whose
    `family` default is `name`)."""
    if not (isinstance(cls, type) and issubclass(cls, TaskConfig)):
        raise ConfigError(f"task family {name!r}: its config must subclass TaskConfig, got {cls!r}")
    if cls().family != name:
        raise ConfigError(f"task family {name!r}: {cls.__name__}.family defaults to "
                          f"{cls().family!r}; set it to {name!r}")
    _TASK_CONFIGS[name] = cls


def task_config_class(name: str) -> type[TaskConfig]:
    """The section class of a family; a name with a dot is a module imported to register it."""
    if name not in _TASK_CONFIGS and "." in name:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name is not None and name.startswith(e.name):
                raise ConfigError(f"rl.task={name!r}: no module {e.name!r} (a plug-in task family "
                                  f"is an importable module path)") from None
            raise ConfigError(f"rl.task={name!r}: importing the task family module failed: "
                              f"{_where(e)}{type(e).__name__}: {e}") from None
        except Exception as e:  # noqa: BLE001  (the family module's own error, shown as it is)
            raise ConfigError(f"rl.task={name!r}: importing the task family module failed: "
                              f"{_where(e)}{type(e).__name__}: {e}") from None
        if name not in _TASK_CONFIGS:
            raise ConfigError(f"rl.task={name!r}: the module imported but registered no task family "
                              f"named {name!r}: decorate its family class with "
                              f"composer_jax.rl.tasks.register, and give its config class "
                              f"(a TaskConfig subclass) `family: str = __name__`")
    if name not in _TASK_CONFIGS:
        raise ConfigError(f"unknown rl task family {name!r}; registered: {sorted(_TASK_CONFIGS)} "
                          f"(a plug-in family is a module path, --set rl.task=package.module)")
    return _TASK_CONFIGS[name]


def _where(e: BaseException) -> str:
    """'file:line: ' of the innermost frame of an exception (where a family module failed)."""
    if isinstance(e, SyntaxError) and e.filename:
        return f"{e.filename}:{e.lineno}: "
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}: " if tb is not None else ""


class _TaskPresets(dict):
    """`--set rl.task=NAME`: the named family's default section (resolved on lookup)."""

    def __contains__(self, name) -> bool:
        try:
            task_config_class(name)
        except ConfigError:
            return False
        return True

    def __getitem__(self, name):
        return task_config_class(name)

    def __iter__(self):
        return iter(sorted(_TASK_CONFIGS))

    def __len__(self) -> int:
        return len(_TASK_CONFIGS)

    def keys(self):
        return sorted(_TASK_CONFIGS)


TASK_PRESETS = _TaskPresets()


# ---------------------------------------------------------------------------------------------
# rl.job, rl.weight_sync
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class JobConfig:
    """Where the rl_async job runs: backend local (threads/processes here) or ray (actors;
    ray_address "" starts a local cluster); worker_mode: local rollout workers as threads or
    JAX-free processes; num_rollout_workers: concurrent episodes; checkpoint_every: trainer state
    + consumed rollout ids every N versions; eval_every: held-out evaluation every N versions
    (0 = off); inference_resource: with backend ray, the inference actor runs (and is restarted)
    only on nodes started with that custom resource (`ray start --resources='{"NAME": 1}'`)."""
    backend: RLBackend = RLBackend.LOCAL
    ray_address: str = ""
    inference_resource: str = ""
    worker_mode: WorkerMode = WorkerMode.THREAD
    num_rollout_workers: int = 8
    checkpoint_every: int = 5
    eval_every: int = 10

    def __post_init__(self):
        _coerce_enums(self, "rl.job")
        for f in ("num_rollout_workers", "checkpoint_every"):
            _check(getattr(self, f) >= 1, f"rl.job.{f} must be >= 1, got {getattr(self, f)}")
        _check(self.eval_every >= 0, f"rl.job.eval_every must be >= 0 (0 = off), got {self.eval_every}")


@dataclasses.dataclass(frozen=True)
class WeightSyncConfig:
    """The weight store (fields of `rl.weights.WeightSyncSettings`): a full snapshot every K
    versions, deltas between; dtype of the shipped inference copy ("" = as trained), names kept
    in their own dtype, chunk size (elements), delta codec (sparse: positions + XOR | xor), zstd
    level, encode/decode threads (0 = min(8, cpus))."""
    full_snapshot_every: int = 10       # a full weight snapshot every K versions, deltas between
    dtype: str = "bfloat16"
    keep_dtype: tuple[str, ...] = ("*bias",)  # parameter names (globs) shipped in their own dtype
    chunk_elems: int = 1 << 20          # elements per shipped chunk
    codec: str = "sparse"
    zstd_level: int = 3                 # zstd compression level of the chunks (1-22)
    threads: int = 0

    def __post_init__(self):
        p = "rl.weight_sync."
        _check(self.full_snapshot_every >= 1, f"{p}full_snapshot_every must be >= 1")
        _check(self.codec in ("sparse", "xor"),
               f"{p}codec must be 'sparse' or 'xor', got {self.codec!r}")
        _check(self.chunk_elems >= 1 and self.threads >= 0 and 1 <= self.zstd_level <= 22,
               f"{p}chunk_elems must be >= 1, {p}threads >= 0 and {p}zstd_level in [1, 22]")


# ---------------------------------------------------------------------------------------------
# rl
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RLConfig:
    """Asynchronous policy-gradient RL (DESIGN.md "Asynchronous RL"). The concave length/effort
    penalty is a reward term, configured with the other rewards in `env.reward_length_*`."""
    group_size: int = 4                 # samples per task; advantage = R - group mean
    loss: PolicyLoss = PolicyLoss.TRUNCATED_IS  # policy loss: truncated_is | ppo_clip
    is_truncation: float = 2.0          # cap on the behaviour importance ratio
    clip_eps: float = 0.2               # PPO clipping (loss=ppo_clip)
    loss_normalizer: float = 4096.0     # token sums are divided by this constant (Dr.GRPO)
    kl_coef: float = 0.0                # k1 KL penalty placed in the reward
    behaviour_reward: BehaviourReward = BehaviourReward.EVERY_GROUP  # where the behaviour terms
                                        # count: every_group | resolved_groups (BehaviourReward)
    max_staleness: int = 4              # admission control: versions ahead of the trainer
    stale_policy: StalePolicy = StalePolicy.DROP   # at consumption, a group older than max_staleness
    schedule: RLSchedule = RLSchedule.REPRODUCIBLE  # reproducible (fixed version per group, job
                                        # order; same seed, same run) | free_running (faster)
    error_penalty: float = 1.0          # an error rollout with trainable tokens gets reward -error_penalty
    router_replay: bool = True          # the trainer's forward reuses the experts chosen at sampling
    summary_trigger_tokens: int = 0     # self-summarization when the context passes this (0 = off)
    resume_mode: ResumeMode = ResumeMode.PREFILL   # a resumed episode's engine session (ResumeMode)
    batch_groups: int = 4               # B: groups (of group_size samples) per trainer step
    steps: int = 40                     # trainer versions to reach
    max_new_tokens: int = 8             # per assistant turn
    temperature: float = 1.0            # sampling temperature of training episodes (> 0); the
                                        # trainer's log-probs are those of logits / temperature
    eval_greedy: bool = True            # held-out episodes greedy; False: sampled at rl.temperature
                                        # with a fixed seed per (version, task)
    seq_len: int = 64                   # trainer row length (tokens)
    task: TaskConfig = ParityTaskConfig()
    job: JobConfig = JobConfig()
    weight_sync: WeightSyncConfig = WeightSyncConfig()

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
        _check(self.error_penalty >= 0, f"rl.error_penalty must be >= 0, got {self.error_penalty}")
        _check(self.kl_coef >= 0, f"rl.kl_coef must be >= 0 (0 = no reference policy), got {self.kl_coef}")
        _check(self.summary_trigger_tokens >= 0,
               f"rl.summary_trigger_tokens must be >= 0 (0 = off), got {self.summary_trigger_tokens}")
        for f in ("batch_groups", "steps", "max_new_tokens", "seq_len"):
            _check(getattr(self, f) >= 1, f"rl.{f} must be >= 1, got {getattr(self, f)}")
        _check(self.max_new_tokens < self.seq_len,
               f"rl.max_new_tokens={self.max_new_tokens} must be < rl.seq_len={self.seq_len}: a "
               f"trainer row holds the prompt and the reply")
        _check(self.temperature > 0,
               f"rl.temperature={self.temperature}: training episodes are sampled at "
               f"rl.temperature and the trainer scores logits / rl.temperature, so it must be "
               f"> 0 (held-out episodes are greedy with rl.eval_greedy=true)")
        _check(isinstance(self.task, TaskConfig),
               f"rl.task must be a task family's section (TaskConfig), got {type(self.task).__name__}")


# Keys of the flat layout before the rl sections: rl.KEY -> the new dotted key under rl.
MOVED_RL_KEYS = {
    "full_snapshot_every": "weight_sync.full_snapshot_every",
    **{f"weight_sync_{k}": f"weight_sync.{k}" for k in (
        "dtype", "keep_dtype", "chunk_elems", "codec", "zstd_level", "threads")},
    **{k: f"job.{k}" for k in ("backend", "ray_address", "worker_mode", "num_rollout_workers",
                               "checkpoint_every", "eval_every")},
    "tasks": "task", "parity_kinds": "task.kinds", "env_latency_scale": "task.env_latency_scale",
    "init_from": "task.init_from", "num_train_tasks": "task.num_train_tasks",
    "num_eval_tasks": "task.num_eval_tasks", "max_turns": "task.max_turns",
    "lookup_levels": "task.levels", "lookup_sft_steps": "task.sft_steps",
    "lookup_sft_hasty": "task.sft_hasty", "lookup_sft_seed": "task.sft_seed",
    "lookup_length_weights": "task.length_weights"}


def migrate_legacy_rl(rl: dict) -> dict:
    """An rl section dict of the flat layout (old config.json) in today's layout; a dict in
    today's layout comes back unchanged (a value already in the new place wins)."""
    old = set(rl) & set(MOVED_RL_KEYS)
    if not old:
        return rl
    out = {k: v for k, v in rl.items() if k not in old}
    task = dict(out.get("task") or {})
    if "tasks" in rl:
        task.setdefault("family", rl["tasks"])
    for k in old - {"tasks"}:
        section, _, leaf = MOVED_RL_KEYS[k].partition(".")
        target = task if section == "task" else out.setdefault(section, {})
        if section != "task":
            out[section] = target = dict(target)
        target.setdefault(leaf, rl[k])
    family = task.get("family", "parity")
    if family != "parity":      # fields another family's section does not have
        task.pop("kinds", None), task.pop("env_latency_scale", None)
    if family != "coding":
        task.pop("init_from", None)
    if family != "lookup":
        for k in ("max_turns", "levels", "sft_steps", "sft_hasty", "sft_seed", "length_weights"):
            task.pop(k, None)
    out["task"] = task
    return out
