"""Asynchronous RL: the main job.

  rl_async   trainer, inference (engine service), rollout workers and evaluator as services that
             talk only through the rollout stream and the weight store; staleness bounded by
             admission control (rl.max_staleness = 2); rollout-level fault tolerance and resume
  rl_sync    the same with rl.max_staleness = 0 (synchronous RL: generate a batch, train, repeat)

Defaults run on a laptop CPU in a few minutes: the known-optimum, multi-turn, tool-using "lookup"
task family (`composer_jax.rl.lookup_tasks`: read the note the prompt names with read_file, follow
it, finish with its code; held-out prompts use keys never trained on) with the `tiny` MoE policy
after a short SFT on training demonstrations. `--set rl.tasks=parity` is the single-turn parity
family, `--set rl.tasks=coding` the sandboxed coding tasks. `--set rl.backend=ray` runs the same
services as Ray actors (`--set rl.ray_address=HOST:PORT` joins a cluster). Outputs in WORKDIR:
config.json, metrics.jsonl, tb/, rollouts/ (the rollout log), checkpoints/, plots/, rl_summary.json,
tokenizer.json and prompts.json (so `eval` / `generate` read the run like any other). Rerunning the
same command resumes from the newest checkpoint; a finished run says so and changes nothing.
SIGTERM / SIGINT finish the current step, checkpoint, write plots and the summary, and exit 0.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import sys

from composer_jax import registry
from composer_jax.config import (Config, EvalConfig, RLConfig, RLTasks, Schedule, TrainConfig,
                                 to_dict)
from composer_jax.env.config import EnvConfig
from composer_jax.errors import ConfigError


def _lookup_config(max_staleness: int) -> Config:
    """rl.tasks=lookup (the default): easy tasks (read_file, then finish: 2 tool calls, 2 turns),
    256 held-out tasks (unseen keys) evaluated every 10 versions by sampled episodes (T = 1, a fixed
    seed per version and task); the initial policy is a fresh tiny MoE after 300 SFT steps on
    optimal training demonstrations (rl.lookup_sft_hasty=0; at 200 steps it cannot yet copy a key,
    at 300 it mostly can), one SFT (rl.lookup_sft_seed) shared by runs of every seed;
    4 groups x 8 samples per step, Adam at a constant 5e-4 (2e-3 collapsed a run into truncated
    garbage calls within 10 versions), Dr.GRPO (loss_normalizer = about the
    sampled tokens of one step). The length term is difficulty-aware (rl.lookup_length_weights:
    easy 1, hard 0) with the weights of `lookup_env_config`; `--set rl.lookup_levels=easy,hard`
    adds hard tasks (a pointer to a second note: 3 tool calls)."""
    from composer_jax.rl.lookup_program import lookup_env_config, lookup_model_config
    rl = RLConfig(tasks=RLTasks.LOOKUP, group_size=8, batch_groups=4, max_staleness=max_staleness,
                  steps=40, num_rollout_workers=32, checkpoint_every=10, eval_every=10,
                  num_train_tasks=256, num_eval_tasks=256, max_new_tokens=40, seq_len=192,
                  max_turns=4, loss_normalizer=1024.0, full_snapshot_every=10,
                  lookup_levels=("easy",), lookup_sft_steps=300, lookup_sft_hasty=0.0,
                  eval_greedy=False)
    train = TrainConfig(steps=rl.steps, lr=5e-4, warmup_steps=0, schedule=Schedule.CONSTANT,
                        weight_decay=0.0, grad_clip=1.0, log_every=1)
    return dataclasses.replace(Config(), model=lookup_model_config(), rl=rl, train=train,
                               env=lookup_env_config())


def _config(max_staleness: int) -> Config:
    from composer_jax.rl.toy_tasks import toy_model_config
    # the recipe of benchmarks/rl_learning_curve.py (issue 15): Adam at a constant 3e-3, Dr.GRPO
    # with loss_normalizer 64 (about one step's tokens), 4 tasks x 8 samples per step, 6 new
    # tokens per reply. Default: the unconditional parity variant (reply with even characters),
    # which a fresh tiny policy learns in ~60 versions; `--set rl.parity_kinds=even,odd --set
    # rl.steps=300` is the conditional one (slower and less reliable: README)
    rl = RLConfig(group_size=8, batch_groups=4, max_staleness=max_staleness, steps=150,
                  num_rollout_workers=32, checkpoint_every=25, eval_every=50,
                  num_train_tasks=64, num_eval_tasks=16, max_new_tokens=6, seq_len=64,
                  loss_normalizer=64.0, full_snapshot_every=10, parity_kinds=("even",))
    train = TrainConfig(steps=150, lr=3e-3, warmup_steps=0, schedule=Schedule.CONSTANT,
                        weight_decay=0.0, grad_clip=1.0, log_every=1)
    return dataclasses.replace(Config(), model=toy_model_config(), rl=rl, train=train)


def _coding_config(max_staleness: int) -> Config:
    """rl.tasks=coding: the policy is the repository's own `sft` run (the cpt_debug model and
    tokenizer, SFT on oracle episodes of the RL task pool's training tasks), RL on that pool's
    sandboxed episodes with real tools; the eval suite's runner scores checkpoints. Sized for a
    CPU run from what the oracle episodes measure (the SFT data): a transcript is 2.4-2.7k tokens
    (prompt ~2.2k) and the longest assistant turn 286 tokens, so turns get 320 new tokens (96
    truncated most `search_replace` calls into invalid ones) in 3072-token rows; 2 groups of 4
    episodes per step with 16 episodes running (up to two versions ahead); episodes get 600 s
    (16 concurrent episodes share the engine with the trainer on 2 cores). The engine gets the
    weights in fp32 (the policy is tiny, and a bf16 copy of the memorised SFT policy raised the
    sampler/trainer log-prob mismatch from 0.0007 to 0.03-0.08 per token); Adam at 1e-4 (3e-4
    with the bf16 copy drove valid calls and resolved rate down; benchmarks/results/rl_coding.txt)."""
    from experiments.pretrain import _sft
    base = _sft()
    rl = RLConfig(tasks=RLTasks.CODING, group_size=4, batch_groups=2, max_staleness=max_staleness,
                  steps=40, num_rollout_workers=16, checkpoint_every=4, eval_every=8,
                  num_train_tasks=12, num_eval_tasks=2, max_new_tokens=320, seq_len=3072,
                  loss_normalizer=1024.0, full_snapshot_every=10, temperature=1.0,
                  weight_sync_dtype="")
    train = TrainConfig(steps=rl.steps, lr=1e-4, warmup_steps=0, schedule=Schedule.CONSTANT,
                        weight_decay=0.0, grad_clip=1.0, log_every=1)
    env = dataclasses.replace(EnvConfig(), max_turns=4, command_timeout_s=10.0,
                              episode_time_s=600.0, use_embeddings=False, num_tasks=rl.num_train_tasks,
                              kinds=("bug",), python_versions=(_python_version(),),
                              max_tasks_per_module=2, workers=2)
    ev = dataclasses.replace(EvalConfig(), max_turns=4, max_new_tokens=320, max_context=3072,
                             concurrency=2)
    return dataclasses.replace(base, rl=rl, train=train, env=env, eval=ev)


def _python_version() -> str:
    """The newest Python of the machine the environment can run tasks with."""
    from composer_jax.env.pythons import find_pythons
    found = find_pythons()
    if not found:
        return "3.12"
    return sorted(found, key=lambda v: tuple(map(int, v.split("."))))[-1]


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def with_task_defaults(cfg: Config, make_defaults) -> Config:
    """`rl_async --set rl.tasks=coding|parity` (or rl_sync): that family's settings
    (`make_defaults(max_staleness)`, e.g. `_coding_config`), with every field the user set (anything
    that differs from the default lookup experiment's config) kept. A config not built from the
    lookup defaults (another model) is returned as is."""
    from composer_jax.config import from_dict
    base = _lookup_config(cfg.rl.max_staleness)
    if cfg.model != base.model:
        return cfg
    flat_base = _flat(to_dict(base))
    user = {k: v for k, v in _flat(to_dict(cfg)).items() if flat_base.get(k) != v}
    out = to_dict(make_defaults(cfg.rl.max_staleness))
    for key, value in user.items():
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
    return from_dict(Config, out)


def with_coding_defaults(cfg: Config) -> Config:
    """`with_task_defaults` with the coding settings (`_coding_config`)."""
    return with_task_defaults(cfg, _coding_config)


def _cache(cfg: Config) -> pathlib.Path:
    from composer_jax.data.config import resolved_cache_dir
    return pathlib.Path(resolved_cache_dir(cfg.data))


def _key(*parts) -> str:
    import hashlib
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def ensure_coding_pool(cfg: Config) -> pathlib.Path:
    """The RL task pool: env.pool_dir, else a cached one (generated on first use from cfg.env:
    num_tasks training tasks of the configured kinds; held-out modules are never used)."""
    from composer_jax.env.tasks.generate import generate_pool
    from composer_jax.env.tasks.pool import TaskPool
    if cfg.env.pool_dir:
        return pathlib.Path(cfg.env.pool_dir)
    e = cfg.env
    d = _cache(cfg) / "rl_pool" / _key(e.num_tasks, e.kinds, e.python_versions, e.task_seed,
                                       e.max_tasks_per_module, e.modules, e.package_sources)
    if len(TaskPool(d)) < e.num_tasks:
        print(f"rl.tasks=coding: generating the task pool ({e.num_tasks} tasks) in {d}",
              file=sys.stderr)
        generate_pool(e, d, progress=True)
    return d


def ensure_sft_policy(cfg: Config, pool: pathlib.Path) -> pathlib.Path:
    """The initial policy: rl.init_from, else the `sft` experiment run on `pool` (cached by pool
    manifest and SFT settings; built on first use: a few minutes on CPU)."""
    if cfg.rl.init_from:
        return pathlib.Path(cfg.rl.init_from)
    from composer_jax import registry
    from composer_jax.api import save_config
    exp = registry.get("sft")
    sft = exp.make_config()
    sft = dataclasses.replace(sft, data=dataclasses.replace(sft.data, sft_pool=str(pool),
                                                            cache_dir=cfg.data.cache_dir),
                              env=cfg.env, seed=cfg.seed)
    manifest = (pool / "manifest.json").read_text() if (pool / "manifest.json").exists() else ""
    d = _cache(cfg) / "rl_sft" / _key(to_dict(sft), manifest)
    if not (d / "checkpoints" / str(sft.train.steps)).exists():     # missing or unfinished: (re)run
        print(f"rl.tasks=coding: building the initial policy (the `sft` experiment) in {d}",
              file=sys.stderr)
        d.mkdir(parents=True, exist_ok=True)
        save_config(sft, d / "config.json")
        exp.run(sft, d)
    return d


def _run_config(cfg: Config, init_from: pathlib.Path) -> Config:
    """The run's config with the policy's architecture (the init run's model section)."""
    from composer_jax.train.weights import run_config
    return dataclasses.replace(run_config(init_from, cfg), seed=cfg.seed)


def program_spec(cfg: Config):
    """The RL program of `rl.tasks` as a ProgramSpec every process can rebuild (coding: after
    `prepare_coding`, which resolves the pool, the initial policy and the tokenizer)."""
    from composer_jax.rl.program import ProgramSpec
    if cfg.rl.tasks == RLTasks.LOOKUP:
        return ProgramSpec("composer_jax.rl.lookup_program:make", {"config": to_dict(cfg)})
    if cfg.rl.tasks == RLTasks.PARITY:
        return ProgramSpec("composer_jax.rl.parity_program:make", {"config": to_dict(cfg)})
    if cfg.rl.tasks == RLTasks.CODING:
        if not cfg.env.pool_dir or not cfg.rl.init_from:
            raise ConfigError("rl.tasks=coding needs env.pool_dir and rl.init_from resolved: "
                              "call experiments.rl.prepare_coding(cfg) first")
        return ProgramSpec("composer_jax.rl.coding_program:make", {
            "config": to_dict(cfg), "pool_dir": cfg.env.pool_dir, "init_from": cfg.rl.init_from,
            "tokenizer": str(pathlib.Path(cfg.rl.init_from) / "tokenizer.json")})
    raise ConfigError(f"rl.tasks={cfg.rl.tasks.value} is not wired into rl_async; valid: "
                      f"{[t.value for t in RLTasks]}")


def prepare_coding(cfg: Config) -> Config:
    """Resolves rl.tasks=coding: coding defaults, the task pool (env.pool_dir), the initial policy
    (rl.init_from, built from the repository's `sft` experiment when unset) and its model."""
    cfg = with_coding_defaults(cfg)
    pool = ensure_coding_pool(cfg)
    cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, pool_dir=str(pool)))
    init = ensure_sft_policy(cfg, pool)
    cfg = dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, init_from=str(init)))
    return _run_config(cfg, init)


def coding_eval_fn(cfg: Config):
    """The checkpoint evaluator's function for rl.tasks=coding: the eval suite's runner
    (`composer_jax.eval.api.eval_resolved_rate`) on rl.num_eval_tasks held-out suite tasks."""
    from composer_jax.data.tokenizer import load_tokenizer
    from composer_jax.eval.api import ensure_suite, eval_resolved_rate
    tok = load_tokenizer(pathlib.Path(cfg.rl.init_from) / "tokenizer.json")
    suite = ensure_suite(cfg, progress=False)

    def evaluate(model, version: int) -> dict:
        return eval_resolved_rate(model, tok, cfg, num_tasks=cfg.rl.num_eval_tasks,
                                  name=f"rl-v{version}", suite=suite)
    return evaluate


def family_eval_fn(cfg: Config):
    """The checkpoint evaluator's function for a family with its own held-out split (lookup):
    greedy episodes of every held-out task with exactly the evaluated version's weights
    (`rl.family_eval.FamilyEvaluator`, what `--experiment=eval --set eval.policy=WORKDIR@V`
    runs too)."""
    from composer_jax.rl.family_eval import FamilyEvaluator
    from composer_jax.rl.program import build_program
    return FamilyEvaluator(build_program(program_spec(cfg)), cfg)


def make_store(cfg: Config):
    """The weight store the trainer publishes to (in-process transport; the inference side reads
    it in this process, or receives versions through Ray's object store with rl.backend=ray)."""
    from composer_jax.config import RLBackend
    from composer_jax.rl.weights import MemoryTransport, WeightStore, WeightSyncSettings
    settings = WeightSyncSettings.from_rl(cfg.rl)
    if cfg.rl.backend == RLBackend.RAY:
        from composer_jax.rl.backend_ray import init_ray, make_ray_store
        init_ray(cfg.rl.ray_address)
        return make_ray_store(settings)
    return WeightStore(MemoryTransport(), settings, reader_name="inference")


def write_run_files(cfg: Config, workdir: pathlib.Path) -> None:
    """WORKDIR/tokenizer.json (the policy's tokenizer) and, for parity, WORKDIR/prompts.json (a
    few held-out task chats), so `generate` and `eval` can sample the run's checkpoints as text."""
    if cfg.rl.tasks == RLTasks.PARITY:
        from composer_jax.rl import toy_tasks as tt
        tt.toy_tokenizer(cfg.model.vocab_size).save(workdir / "tokenizer.json")
        tasks = tt.make_tasks(cfg.rl.num_eval_tasks, cfg.seed, "eval", tuple(cfg.rl.parity_kinds))
        (workdir / "prompts.json").write_text(json.dumps([t.messages() for t in tasks[:4]]))
    elif cfg.rl.tasks == RLTasks.LOOKUP:
        from composer_jax.rl import lookup_tasks as lt
        from composer_jax.rl.lookup_program import lookup_tokenizer
        lookup_tokenizer(cfg.model.vocab_size).save(workdir / "tokenizer.json")
        tasks = lt.make_tasks(cfg.rl.num_eval_tasks, cfg.seed, "eval", tuple(cfg.rl.lookup_levels))
        (workdir / "prompts.json").write_text(json.dumps([t.messages() for t in tasks[:4]]))
    elif cfg.rl.init_from:
        src = pathlib.Path(cfg.rl.init_from) / "tokenizer.json"
        if src.is_file():
            (workdir / "tokenizer.json").write_bytes(src.read_bytes())


def run(cfg: Config, workdir: pathlib.Path) -> dict:
    from composer_jax.rl.driver import finished_version, run_rl, settings_from_config
    from composer_jax.rl.plots import write_plots
    from composer_jax.rl.run_report import end_summary
    from composer_jax.runlog import read_metrics
    from composer_jax.stopping import stop_signals
    done_at = finished_version(workdir, cfg.rl.steps)
    if done_at is not None:
        print(f"already finished at version {done_at} (rl.steps={cfg.rl.steps}): nothing to do; "
              f"summary {workdir / 'rl_summary.json'}, plots {workdir / 'plots'}. Raise rl.steps "
              f"to train on, or use another --workdir")
        return {"version": done_at, "already_finished": True}
    eval_fn = None
    with stop_signals() as stop:
        if cfg.rl.tasks == RLTasks.PARITY:
            from composer_jax.api import save_config
            cfg = with_task_defaults(cfg, _config)
            save_config(cfg, workdir / "config.json")     # the parity settings actually run
        if cfg.rl.tasks == RLTasks.CODING:
            from composer_jax.api import save_config
            cfg = prepare_coding(cfg)
            save_config(cfg, workdir / "config.json")     # the resolved pool, policy and model
            eval_fn = coding_eval_fn(cfg) if cfg.rl.eval_every > 0 else None
        if cfg.rl.tasks == RLTasks.LOOKUP and cfg.rl.eval_every > 0:
            eval_fn = family_eval_fn(cfg)
        write_run_files(cfg, workdir)
        try:
            summary = run_rl(program_spec(cfg), workdir, settings_from_config(cfg),
                             make_store(cfg), stop_event=stop, eval_fn=eval_fn)
        finally:
            if cfg.rl.backend.value == "ray" and not cfg.rl.ray_address:
                import ray
                ray.shutdown()                      # the local cluster this run started
        write_plots(workdir, summary)
    name = "rl_sync" if cfg.rl.max_staleness == 0 else "rl_async"
    print(end_summary(name, summary, workdir, read_metrics(workdir)))
    return summary


def check_steps(default):
    """An RL run trains `rl.steps` versions (its learning-rate schedule spans them too:
    `rl.step.build_rl_step`); `train.steps` is not used, so setting it is an error that says so."""
    def check(cfg: Config) -> None:
        if cfg.train.steps != default().train.steps:
            raise ConfigError(f"train.steps={cfg.train.steps}: RL runs train rl.steps versions "
                              f"(now {cfg.rl.steps}) and do not read train.steps; set rl.steps "
                              f"instead")
    return check


registry.register("rl_async", "asynchronous RL on the multi-turn tool-using lookup family "
                  "(streamed rollouts, in-flight weight updates, staleness <= rl.max_staleness=2 "
                  "at consumption, fault-tolerant; local or Ray backend)",
                  lambda: _lookup_config(2), run, check_steps(lambda: _lookup_config(2)))
registry.register("rl_sync", "the rl_async job with rl.max_staleness=0 (synchronous RL baseline)",
                  lambda: _lookup_config(0), run, check_steps(lambda: _lookup_config(0)))
registry.register("rl_async_parity", "rl_async on the single-turn parity family (= rl_async "
                  "--set rl.tasks=parity with the parity settings)", lambda: _config(2), run,
                  check_steps(lambda: _config(2)))
registry.register("rl_async_coding", "rl_async on sandboxed coding tasks (= rl_async --set "
                  "rl.tasks=coding): SFT-initialised policy, real tools, eval-suite evaluator",
                  lambda: _coding_config(2), run, check_steps(lambda: _coding_config(2)))
