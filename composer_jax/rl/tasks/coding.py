"""rl.task=coding: sandboxed coding episodes of the environment's task pool, run by the token-level
agent (`agent.token_agent.TokenAgent`) against the policy server, graded by the environment
(`env.grading.grade_workspace`) and rewarded by `env.rewards.compute_reward` (resolved,
valid/invalid tool calls, the concave effort penalty, communication, out-of-scope edits, false
claims, tampering).

- `prepare(cfg)` (driver, once): the task pool (env.pool_dir, else a cached pool generated from
  cfg.env), the initial policy (rl.task.init_from or train.init_from; `experiments/rl.py` runs the
  repository's `sft` experiment on that pool, cached, when neither is set) and the run's model
  (the policy's architecture).
- env side: the pool's training tasks (`split == "train"`); an episode opens a copy-on-write
  sandbox over the task's snapshot and runs the agent, whose engine is an `EngineClient` of the
  policy server (in process, over a pipe or through Ray).
- inference and trainer side: the initial policy's weights; the engine's context is one less
  than the trainer's rows (a turn cut at the context limit is closed by the agent with one more
  fed <|im_end|>), and prefill runs one row per call (episodes start and return from their tools
  at different times; measured: 19 episodes in 12 minutes with 16 padded rows on 2 cores).
- held-out evaluation: the eval suite's runner on the trainer's weights (`make_eval_fn`), not
  program episodes (`make_tasks("eval") == []`).
- the difficulty ladder (`rl.task.levels=1` or `1,2`): the pool is the ladder pool
  (`env.tasks.ladder_generate`: env.pool_dir, else a cached one generated on first use), training
  tasks are its training-module tasks of those levels and `make_tasks("eval")` its held-out-module
  tasks of the same levels (balanced across levels), scored as held-out episodes by the rollout
  workers (no eval-suite function). The SFT policy `experiments/rl.py` builds is trained on the
  same pool's training tasks only (`data/sft_env.py` takes `split == "train"`).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import pathlib
import sys

from composer_jax.agent.policy_client import EngineClient
from composer_jax.agent.tasks import TaskFamily
from composer_jax.agent.token_agent import AgentConfig, SeededTurns, TokenAgent
from composer_jax.config.data import resolved_cache_dir
from composer_jax.config.rl import CodingTaskConfig, LadderKeywords
from composer_jax.data.tokenizer import load_tokenizer
from composer_jax.env.pythons import find_pythons
from composer_jax.env.tasks.generate import generate_pool
from composer_jax.env.tasks.ladder_generate import LadderSpec, generate_ladder, level_kind
from composer_jax.env.tasks.ladder_stats import site_kind
from composer_jax.env.tasks.pool import TaskPool
from composer_jax.errors import ConfigError
from composer_jax.rl.tasks.registry import register
from composer_jax.train.run_checkpoint import parse_run_source, run_config


@functools.lru_cache(maxsize=4)
def _tokenizer(path: str):
    return load_tokenizer(pathlib.Path(path))


@functools.lru_cache(maxsize=4)
def _pool_tasks(pool_dir: str, levels: tuple = ()):
    """(pool, training tasks, held-out tasks) by task id; with ladder `levels`, only tasks of
    those levels, interleaved level by level (so any prefix is balanced across levels)."""
    pool = TaskPool(pathlib.Path(pool_dir))
    tasks = sorted(pool.tasks(), key=lambda t: t.task_id)
    if not levels:
        return pool, [t for t in tasks if t.split == "train"], []
    return pool, *(interleave([[t for t in tasks if t.split == split and t.kind == level_kind(lv)]
                               for lv in levels]) for split in ("train", "eval"))


def read_task_ids(path: str) -> list[str]:
    """The task ids of a text file, one per line; '#' starts a comment, blank lines are skipped."""
    p = pathlib.Path(path)
    if not p.is_file():
        raise ConfigError(f"rl.task.train_tasks_file={path}: no such file (write one with "
                          f"benchmarks/rl_coding_ladder.py --pass_rates, or leave it empty)")
    ids = [line.split("#", 1)[0].strip() for line in p.read_text().splitlines()]
    return [i for i in ids if i]


def listed_tasks(path: str, train: list, heldout: list) -> list:
    """The training tasks (of `train`) whose ids the file at `path` lists, in the file's order.
    ConfigError for an empty list, a repeated id, a held-out task or an id the pool lacks."""
    ids = read_task_ids(path)
    by_id, held = {t.task_id: t for t in train}, {t.task_id for t in heldout}
    bad = {"held-out": [i for i in ids if i in held],
           "not in the pool's training tasks": [i for i in ids if i not in by_id and i not in held]}
    for why, which in bad.items():
        if which:
            raise ConfigError(f"rl.task.train_tasks_file={path}: {len(which)} id(s) {why} "
                              f"(first: {which[0]}); list training task ids of this pool only")
    if not ids or len(set(ids)) != len(ids):
        raise ConfigError(f"rl.task.train_tasks_file={path}: "
                          + ("lists no task" if not ids else "repeats a task id"))
    return [by_id[i] for i in ids]


def interleave(lists: list[list]) -> list:
    """[a0, b0, a1, b1, ...]: the lists' items taken in turn until all are used."""
    out = []
    for i in range(max(map(len, lists), default=0)):
        out += [items[i] for items in lists if i < len(items)]
    return out


@register
class CodingFamily(TaskFamily):
    name = "coding"
    grades_code = True          # its reward runs the agent's code: refused on the fallback sandbox
    config_cls = CodingTaskConfig
    resumable = True            # episodes checkpoint every turn (the workspace as a diff) and resume

    def __init__(self, cfg):
        super().__init__(cfg)
        t = self.task_cfg
        if not cfg.env.pool_dir or not (t.init_from or t.tokenizer):
            raise ConfigError("rl.task=coding needs env.pool_dir and rl.task.init_from (or "
                              "rl.task.tokenizer) resolved: call CodingFamily.prepare(cfg) first")
        self.pool_dir, self.init_from = cfg.env.pool_dir, t.init_from
        self.tokenizer_path = t.tokenizer or str(pathlib.Path(t.init_from) / "tokenizer.json")
        self.levels = tuple(t.levels)
        self.pool, tasks, heldout = _pool_tasks(self.pool_dir, self.levels)
        if not tasks:
            what = f"tasks of levels {self.levels}" if self.levels else "tasks"
            raise ConfigError(f"rl.task=coding: the task pool {self.pool_dir} holds no training "
                              f"{what}; build one with --experiment=env_generate (the ladder: "
                              f"--experiment=env_ladder) or set env.pool_dir")
        train = (listed_tasks(t.train_tasks_file, tasks, heldout) if t.train_tasks_file
                 else tasks[:t.num_train_tasks])
        self._train = [x.task_id for x in train]
        self._eval = [x.task_id for x in heldout[:t.num_eval_tasks]]
        self._tasks = {x.task_id: x for x in train + heldout[:t.num_eval_tasks]}

    def make_tasks(self, split: str) -> list[str]:
        return list(self._train) if split == "train" else list(self._eval)

    def tokenizer(self):
        return _tokenizer(self.tokenizer_path)

    def run_episode(self, task_id, seed, policy, *, greedy, checkpoint=None, resume=None):
        rl, task = self.cfg.rl, self._tasks[task_id]
        engine = EngineClient(policy, self.engine_settings()["max_len"], self.cfg.model.vocab_size)
        agent_cfg = AgentConfig(summary_trigger_tokens=rl.summary_trigger_tokens,
                                max_new_tokens=rl.max_new_tokens,
                                # held-out episodes come greedy; rl.eval_greedy=false samples
                                # them at rl.temperature like the lookup family's evaluator
                                temperature=0.0 if greedy and rl.eval_greedy else rl.temperature,
                                record_messages=False,
                                resume_replay=rl.resume_mode.value == "replay")
        agent = TokenAgent(engine, self.tokenizer(), agent_cfg, self.cfg.env,
                           policy=self.turn_policy(task_id, seed))
        # a crashed episode comes back as an error rollout (reward 0, reason kept), never raises
        rollout = agent.run(task, self.pool.task_dir(task_id), checkpoint=checkpoint, resume=resume)
        if self.levels:     # ladder episodes: per-kind rows (`level_metrics`: level1_name_typo_resolved_rate, ...)
            rollout.info["level"] = f"{task.kind}_{site_kind(task)}"
        return rollout

    def turn_policy(self, task_id: str, seed: int):
        """How the episode's turns are generated: sampled with a seed per (episode, turn)."""
        return SeededTurns(seed)

    def engine_settings(self) -> dict:
        return {**super().engine_settings(), "max_len": self.cfg.rl.seq_len - 1,
                "prefill_batch": 1}

    def initial_model(self):
        """The initial policy: `rl.task.init_from` (a run workdir); "" = a fresh cfg.model."""
        if not self.init_from:
            return super().initial_model()
        from composer_jax.train.weights import load_weights  # JAX: not in rollout workers
        w = load_weights(self.init_from, self.cfg)
        if w.model_cfg.vocab_size != self.cfg.model.vocab_size:
            raise ConfigError(f"rl.task.init_from={self.init_from!r} has vocab "
                              f"{w.model_cfg.vocab_size}, the run's model.vocab_size is "
                              f"{self.cfg.model.vocab_size}")
        return w.model()

    def write_run_files(self, workdir) -> None:
        """WORKDIR/tokenizer.json: a copy of the initial policy's tokenizer file."""
        src = pathlib.Path(self.tokenizer_path)
        if src.is_file():
            (pathlib.Path(workdir) / "tokenizer.json").write_bytes(src.read_bytes())

    def make_eval_fn(self):
        """The eval suite's runner (`eval.api.eval_resolved_rate`) on rl.task.num_eval_tasks
        held-out suite tasks, or None with rl.job.eval_every = 0 or with ladder levels (their
        held-out tasks are the family's own `make_tasks("eval")` episodes)."""
        if self.cfg.rl.job.eval_every <= 0 or self.levels:
            return None
        from composer_jax.eval.api import ensure_suite, eval_resolved_rate  # JAX: driver side
        cfg, tok = self.cfg, self.tokenizer()
        suite = ensure_suite(cfg, progress=False)

        def evaluate(model, version: int) -> dict:
            return eval_resolved_rate(model, tok, cfg, num_tasks=cfg.rl.task.num_eval_tasks,
                                      name=f"rl-v{version}", suite=suite)
        return evaluate

    @classmethod
    def prepare(cls, cfg):
        """Resolves the pool (env.pool_dir), the initial policy (rl.task.init_from, else the run of
        train.init_from; the RL experiment gives it the cached `sft` run when neither is set) and
        the run's model (its architecture)."""
        pool = ensure_pool(cfg)
        cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, pool_dir=str(pool)))
        if cfg.train.init_from and not cfg.rl.task.init_from:   # the run's tokenizer and model
            run_dir, _ = parse_run_source(cfg.train.init_from)
            task = dataclasses.replace(cfg.rl.task, init_from=str(run_dir))
            cfg = dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, task=task))
        if not cfg.rl.task.init_from:
            raise ConfigError("rl.task=coding needs an initial policy: rl.task.init_from or "
                              "train.init_from (a run's workdir); `--experiment=rl_async` builds "
                              "one with the `sft` experiment on the task pool")
        cfg = with_policy_prompt_tools(cfg, pathlib.Path(cfg.rl.task.init_from))
        return dataclasses.replace(run_config(pathlib.Path(cfg.rl.task.init_from), cfg),
                                   seed=cfg.seed)


def with_policy_prompt_tools(cfg, run_dir: pathlib.Path):
    """cfg with the prompt the initial policy's SFT samples had (its run's config): env.prompt_tools
    = `data.sft_prompt_tools` when env.prompt_tools is unset (a ConfigError when both are set and
    differ: the policy would see a prompt it was not trained on), and env.declare_tools =
    `data.sft_declare_tools` (declarations or none, as the policy was trained)."""
    path = run_dir / "config.json"
    data = json.loads(path.read_text()).get("data", {}) if path.is_file() else {}
    trained = tuple(data.get("sft_prompt_tools", ()))
    declare = bool(data.get("sft_declare_tools", cfg.env.declare_tools))
    if trained and cfg.env.prompt_tools and tuple(cfg.env.prompt_tools) != trained:
        raise ConfigError(f"env.prompt_tools={list(cfg.env.prompt_tools)} but the initial policy "
                          f"{run_dir} was trained with the tools {list(trained)} declared")
    tools = trained or tuple(cfg.env.prompt_tools)
    if (tools, declare) == (tuple(cfg.env.prompt_tools), cfg.env.declare_tools):
        return cfg
    print(f"rl.task=coding: env.prompt_tools={list(tools)}, env.declare_tools={declare} (the "
          f"initial policy's SFT prompt)", file=sys.stderr)
    return dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, prompt_tools=tools,
                                                            declare_tools=declare))


def _cache(cfg) -> pathlib.Path:
    return pathlib.Path(resolved_cache_dir(cfg.data))


def _key(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def ladder_spec(task_cfg: CodingTaskConfig) -> LadderSpec:
    """What the ladder pool must hold for `rl.task` (its levels, tasks per level and split)."""
    return LadderSpec(levels=tuple(task_cfg.levels), train=task_cfg.ladder_train,
                      heldout=task_cfg.ladder_heldout, seed=task_cfg.split_seed,
                      fraction=task_cfg.heldout_fraction, keywords=task_cfg.ladder_keywords)


def ladder_env(cfg):
    """cfg.env with the ladder's CPythons (rl.task.ladder_pythons, else every installed 3.8+)."""
    versions = tuple(cfg.rl.task.ladder_pythons) or tuple(sorted(
        (v for v in find_pythons() if tuple(map(int, v.split("."))) >= (3, 8)),
        key=lambda v: tuple(map(int, v.split(".")))))
    return dataclasses.replace(cfg.env, python_versions=versions)


def ensure_ladder_pool(cfg) -> pathlib.Path:
    """The ladder pool of rl.task.levels: env.pool_dir, else a cached one keyed by the split and
    the sources (one pool serves every level: a level asked for later is added to it), filled up
    to rl.task.ladder_train / ladder_heldout tasks per level on first use."""
    t, e = cfg.rl.task, ladder_env(cfg)
    spec = ladder_spec(t)
    d = (pathlib.Path(cfg.env.pool_dir) if cfg.env.pool_dir else
         _cache(cfg) / "ladder_pool" / _key(spec.seed, spec.fraction, e.python_versions,
                                            e.task_seed, e.max_tasks_per_module, e.modules,
                                            e.package_sources, e.stdlib_sources,
                                            # the default keeps the keys of pools made before it
                                            *(() if spec.keywords is LadderKeywords.ANY else
                                              (spec.keywords.value,))))
    print(f"rl.task=coding: the ladder pool (levels {spec.levels}) in {d}", file=sys.stderr)
    generate_ladder(e, d, spec, progress=True)
    return d


def ensure_pool(cfg) -> pathlib.Path:
    """The RL task pool: with rl.task.levels the ladder pool (`ensure_ladder_pool`); else
    env.pool_dir, else a cached one (generated on first use from cfg.env: num_tasks training tasks
    of the configured kinds; held-out modules are never used)."""
    if getattr(cfg.rl.task, "levels", ()):
        return ensure_ladder_pool(cfg)
    if cfg.env.pool_dir:
        return pathlib.Path(cfg.env.pool_dir)
    e = cfg.env
    d = _cache(cfg) / "rl_pool" / _key(e.num_tasks, e.kinds, e.python_versions, e.task_seed,
                                       e.max_tasks_per_module, e.modules, e.package_sources)
    if len(TaskPool(d)) < e.num_tasks:
        print(f"rl.task=coding: generating the task pool ({e.num_tasks} tasks) in {d}",
              file=sys.stderr)
        generate_pool(e, d, progress=True)
    return d
