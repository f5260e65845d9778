"""`EnvConfig`: the typed, frozen, validated configuration of the agent environment.

Every field has a default and is an int, float, str, bool, str-valued enum or tuple, so that
`launch.py --set env.num_tasks=300` can type-check overrides. Pure Python, no JAX.

Groups of fields:
  sandbox_*, command_*, *_limit_*   the sandbox (bubblewrap) and its per-command resource limits;
  read_*, grep_*, search_*          caps of the coding-assistant tools;
  max_turns, max_tokens, ...        limits of one episode;
  num_tasks, python_versions, ...   offline task generation (`env_generate`);
  reward_*                          weights of the reward components (`composer_jax.env.rewards`).
"""
from __future__ import annotations

import dataclasses
import enum
import re

from composer_jax.errors import ConfigError


class SandboxBackend(str, enum.Enum):
    """Which sandbox runs commands."""
    AUTO = "auto"          # bubblewrap when installed, else the fallback with a loud warning
    BWRAP = "bwrap"        # bubblewrap; an error if it is missing
    FALLBACK = "fallback"  # no isolation beyond rlimits, a scratch copy and a process group


class ShellMode(str, enum.Enum):
    """How `run_terminal_cmd` runs commands."""
    FRESH = "fresh"            # a fresh sandboxed shell per command (no state carried over)
    PERSISTENT = "persistent"  # one sandboxed shell per episode (cwd and variables persist)


class Split(str, enum.Enum):
    """Which modules produce tasks: training tasks never come from held-out modules."""
    TRAIN = "train"
    EVAL = "eval"


TASK_KINDS = ("bug", "feature", "migration", "multi_bug", "refactor", "large_feature")
_VERSION_RE = re.compile(r"^3\.\d{1,2}$")


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


@dataclasses.dataclass(frozen=True)
class EnvConfig:
    """Sandbox limits, tool caps, episode limits, task generation and reward weights."""
    # --- sandbox -------------------------------------------------------------------------------
    # auto (bubblewrap if installed) | bwrap | fallback (rlimits only)
    sandbox_backend: SandboxBackend = SandboxBackend.AUTO
    # fresh shell per command | persistent shell per episode
    shell_mode: ShellMode = ShellMode.FRESH
    command_timeout_s: float = 30.0     # wall-clock limit of one sandboxed command
    memory_limit_mb: int = 2048         # memory limit of a sandboxed command
    max_processes: int = 64             # process limit of a sandboxed command
    max_file_size_mb: int = 64          # largest file a sandboxed command may write
    max_open_files: int = 256           # open-file limit of a sandboxed command
    max_output_bytes: int = 16384       # command output kept for the agent (the rest is cut)
    extra_ro_binds: tuple[str, ...] = ()  # extra host paths mounted read-only in the sandbox
    allow_unsandboxed_rewards: bool = False  # let RL train on rewards graded by the fallback
                                             # backend (the policy can tamper with them)
    # --- tools ---------------------------------------------------------------------------------
    read_max_lines: int = 250
    grep_max_hits: int = 50             # grep tool: hits returned
    search_max_results: int = 20        # file search tool: results returned
    codebase_search_top_k: int = 5      # codebase_search tool: chunks returned
    use_embeddings: bool = True         # codebase_search uses the embedding model (else BM25 only)
    prompt_tools: tuple[str, ...] = ()  # tools declared in the prompt (() = all); every tool still
                                        # works when called (a shorter prompt, not fewer tools)
    declare_tools: bool = True          # declare tools in the prompt at all (False: none; a policy
                                        # that learnt the protocol from demonstrations needs none)
    # --- episode -------------------------------------------------------------------------------
    max_turns: int = 40                 # assistant turns per episode
    max_tokens: int = 65536             # tokens per episode
    episode_time_s: float = 900.0       # wall-clock limit of an episode
    # --- task generation -----------------------------------------------------------------------
    num_tasks: int = 240                # tasks env_generate aims for
    min_task_fraction: float = 0.5     # generation ending below this fraction of num_tasks is an
                                       # error (with the reasons); an empty pool
                                       # always is
    python_versions: tuple[str, ...] = ("3.11", "3.12", "3.13")
    kinds: tuple[str, ...] = TASK_KINDS  # task kinds generated
    split: Split = Split.TRAIN          # modules tasks come from: train | eval (held-out modules)
    pool_dir: str = ""                 # "" means WORKDIR/pool
    workers: int = 2                    # processes generating tasks
    max_tasks_per_module: int = 6       # tasks at most from one module
    max_module_lines: int = 3000        # larger modules make no tasks
    max_test_file_seconds: float = 1.5  # test files slower than this are skipped
    baseline_timeout_s: float = 8.0    # a module's first full test run (slow files get trimmed)
    max_task_test_seconds: float = 0.5  # a task's tests must run within this
    test_timeout_s: float = 20.0        # wall-clock limit of a task's test run
    fork_server: bool = True           # generation test runs fork from a warm sandboxed runner
    max_fail_to_pass: int = 40          # FAIL_TO_PASS tests kept per task
    max_pass_to_pass: int = 200        # PASS_TO_PASS: every previously passing test of the touched
                                       # test modules, up to this many (and max_task_test_seconds)
    large_feature_min_lines: int = 50  # a large_feature task removes at least this many lines
    modules: tuple[str, ...] = ()      # only these module names ("textwrap", "simplejson.decoder");
                                       # empty: every discovered module
    max_migration_lines: int = 300
    task_seed: int = 0                  # seed of task generation
    # installed packages whose own unittest suites make task sources (`tasks/sources.py`), looked
    # for in package_dirs, then the running environment's and the CPythons' site-packages
    stdlib_sources: bool = True        # False: tasks from package_sources only
    # installed packages whose unittest suites make tasks
    package_sources: tuple[str, ...] = ("simplejson", "pyflakes")
    package_dirs: tuple[str, ...] = ()  # where package_sources are looked for first
    # --- rewards -------------------------------------------------------------------------------
    # reward per fraction of FAIL_TO_PASS tests fixed on an unresolved task
    reward_partial_credit: float = 0.0
    reward_invalid_call: float = 0.05   # penalty per invalid tool call
    reward_invalid_call_cap: float = 0.5  # cap of the total invalid-call penalty
    reward_outside_edit: float = 0.1    # penalty for editing files outside the task's scope
    reward_false_claim: float = 0.2     # penalty for claiming success on an unresolved task
    reward_tampering: float = 2.0      # grader-detected tampering (`env/tamper.py`)
    reward_length_coef: float = 0.005   # scale of the concave length/effort penalty
    reward_length_k: float = 0.01       # length penalty: the effort scale k
    reward_length_q: float = 2.0        # length penalty: the concavity exponent q
    reward_length_token_weight: float = 0.001  # effort weight of a generated token
    reward_length_call_weight: float = 1.0  # effort weight of a tool call
    reward_length_turn_weight: float = 1.0  # effort weight of a turn
    reward_length_tool_call_token_weight: float = 0.001   # effort weights of real token counts
    reward_length_tool_output_weight: float = 0.0002      # (`rewards.EffortCounts`); content tokens
    reward_length_final_weight: float = 0.001             # use reward_length_token_weight
    reward_valid_call: float = 0.05    # x base x fraction of calls that were valid
    reward_communication: float = 0.05  # clear, short final message on a resolved task
    # a final message longer than this earns no communication reward
    reward_communication_max_tokens: int = 200

    def __post_init__(self):
        p = "env."
        _check(isinstance(self.sandbox_backend, SandboxBackend),
               f"{p}sandbox_backend must be one of {[m.value for m in SandboxBackend]}, "
               f"got {self.sandbox_backend!r}")
        _check(isinstance(self.shell_mode, ShellMode),
               f"{p}shell_mode must be one of {[m.value for m in ShellMode]}, got {self.shell_mode!r}")
        _check(isinstance(self.split, Split),
               f"{p}split must be one of {[m.value for m in Split]}, got {self.split!r}")
        for f in ("command_timeout_s", "episode_time_s", "max_test_file_seconds",
                  "max_task_test_seconds", "test_timeout_s", "baseline_timeout_s"):
            _check(getattr(self, f) > 0, f"{p}{f} must be > 0 seconds, got {getattr(self, f)}")
        for f in ("memory_limit_mb", "max_processes", "max_file_size_mb", "max_open_files",
                  "max_output_bytes", "read_max_lines", "grep_max_hits", "search_max_results",
                  "codebase_search_top_k", "max_turns", "max_tokens", "num_tasks", "workers",
                  "max_tasks_per_module", "max_module_lines", "max_fail_to_pass",
                  "max_pass_to_pass", "max_migration_lines", "large_feature_min_lines"):
            _check(isinstance(getattr(self, f), int) and getattr(self, f) > 0,
                   f"{p}{f} must be a positive integer, got {getattr(self, f)!r}")
        _check(isinstance(self.allow_unsandboxed_rewards, bool),
               f"{p}allow_unsandboxed_rewards must be true or false, "
               f"got {self.allow_unsandboxed_rewards!r}")
        _check(0.0 <= self.min_task_fraction <= 1.0,
               f"{p}min_task_fraction must be in [0, 1], got {self.min_task_fraction}")
        _check(self.memory_limit_mb >= 64, f"{p}memory_limit_mb must be >= 64, got {self.memory_limit_mb}")
        _check(self.max_processes >= 4, f"{p}max_processes must be >= 4, got {self.max_processes}")
        _check(self.max_output_bytes >= 256,
               f"{p}max_output_bytes must be >= 256, got {self.max_output_bytes}")
        _check(isinstance(self.prompt_tools, tuple) and all(isinstance(t, str) for t in self.prompt_tools),
               f"{p}prompt_tools must be a tuple of tool names, got {self.prompt_tools!r}")
        _check(isinstance(self.declare_tools, bool),
               f"{p}declare_tools must be true or false, got {self.declare_tools!r}")
        for b in self.extra_ro_binds:
            _check(isinstance(b, str) and b.startswith("/"),
                   f"{p}extra_ro_binds must hold absolute paths, got {b!r}")
        _check(len(self.python_versions) >= 1,
               f"{p}python_versions must name at least one CPython version like '3.12'")
        for v in self.python_versions:
            _check(isinstance(v, str) and bool(_VERSION_RE.match(v)),
                   f"{p}python_versions entries must look like '3.12', got {v!r}")
        _check(len(set(self.python_versions)) == len(self.python_versions),
               f"{p}python_versions has duplicates: {self.python_versions}")
        _check(len(self.kinds) >= 1 and all(k in TASK_KINDS for k in self.kinds),
               f"{p}kinds must be a non-empty subset of {TASK_KINDS}, got {self.kinds}")
        _check(len(set(self.kinds)) == len(self.kinds), f"{p}kinds has duplicates: {self.kinds}")
        for name in self.package_sources:
            _check(isinstance(name, str) and name.isidentifier(),
                   f"{p}package_sources entries must be top-level import names like 'simplejson', "
                   f"got {name!r}")
        _check(len(set(self.package_sources)) == len(self.package_sources),
               f"{p}package_sources has duplicates: {self.package_sources}")
        for d in self.package_dirs:
            _check(isinstance(d, str) and d.startswith("/"),
                   f"{p}package_dirs must hold absolute paths, got {d!r}")
        for f in ("reward_partial_credit", "reward_invalid_call", "reward_invalid_call_cap",
                  "reward_outside_edit", "reward_false_claim", "reward_tampering", "reward_length_coef",
                  "reward_length_k", "reward_length_token_weight", "reward_length_call_weight",
                  "reward_length_turn_weight", "reward_length_tool_call_token_weight",
                  "reward_length_tool_output_weight", "reward_length_final_weight",
                  "reward_valid_call", "reward_communication",
                  "reward_communication_max_tokens"):
            _check(getattr(self, f) >= 0, f"{p}{f} must be >= 0, got {getattr(self, f)}")
        _check(self.reward_partial_credit <= 1.0,
               f"{p}reward_partial_credit must be in [0, 1], got {self.reward_partial_credit}")
        _check(self.reward_length_k > 0, f"{p}reward_length_k must be > 0, got {self.reward_length_k}")
        _check(self.reward_length_q >= 0,
               f"{p}reward_length_q must be >= 0 (q=1 is the log limit), got {self.reward_length_q}")
