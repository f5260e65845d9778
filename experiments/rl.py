"""Asynchronous RL: the main job.

  rl_async   trainer, inference (engine service), rollout workers and evaluator as services that
             talk only through the rollout stream and the weight store; staleness bounded by
             admission control (rl.max_staleness = 2); rollout-level fault tolerance and resume
  rl_sync    the same with rl.max_staleness = 0 (synchronous RL: generate a batch, train, repeat)

Defaults run on a laptop CPU in a few minutes: the known-optimum, multi-turn, tool-using "lookup"
task family (`composer_jax.rl.tasks.lookup`: read the note the prompt names with read_file,
follow it, finish with its code; held-out prompts use keys never trained on) with the `tiny` MoE
policy after a short SFT on training demonstrations. `--set rl.task=parity` is the single-turn
parity family (with the `rl_async_parity` settings), `--set rl.task=coding` the sandboxed coding
tasks; `--set rl.task=NAME` runs any registered task family (`composer_jax.rl.tasks`; README
"Adding an RL task"), `--set
rl.job.backend=ray` the same services as Ray actors (`--set rl.job.ray_address=HOST:PORT` joins a
cluster). Outputs in WORKDIR:
config.json, metrics.jsonl, tb/, rollouts/ (the rollout log), checkpoints/, plots/, rl_summary.json,
tokenizer.json and prompts.json (so `eval` / `generate` read the run like any other). Rerunning the
same command resumes from the newest checkpoint; a finished run says so and changes nothing.
SIGTERM / SIGINT finish the current step, checkpoint, write plots and the summary, and exit 0.
The run's length is rl.steps (train.steps is not read: setting it is an error).
"""
from __future__ import annotations

import dataclasses
import pathlib
import sys

from composer_jax import registry
from composer_jax.config import (CodingTaskConfig, Config, EnvConfig, EvalConfig, JobConfig,
                                 LookupTaskConfig, ParityTaskConfig, RLConfig, Schedule,
                                 TrainConfig, WeightSyncConfig)
from composer_jax.errors import ConfigError


def _lookup_config(max_staleness: int) -> Config:
    """rl.task=lookup (the default): easy tasks (read_file, then finish: 2 tool calls, 2 turns),
    256 held-out tasks (unseen keys) evaluated every 10 versions by sampled episodes (T = 1, a fixed
    seed per version and task: rl.eval_greedy=false). The initial policy is a fresh tiny MoE after
    1600 SFT steps (Adam at 3e-3, cosine decay to 0) on training demonstrations of which half are
    hasty (rl.task.sft_hasty=0.5: finish with a guessed code at once, claiming success): it knows
    the protocol and copies keys, and guesses on about half the episodes, the habit RL has to
    remove (held-out ~0.52 at version 0). One SFT (rl.task.sft_seed) is shared by runs of every
    seed. RL: 4 groups x 8 samples per step, Dr.GRPO (loss_normalizer = about the sampled tokens
    of one step), Adam warmed up linearly over 5 versions (without it the first steps made the
    rollouts of 1-2 versions earlier far off-policy: IS weights up to 493) to 3e-4, held to
    version 20, then decayed linearly to 3e-5 over the last 20 (train.schedule=wsd,
    decay_fraction 0.5); the engine gets the weights in fp32 (rl.weight_sync.dtype="": the policy
    is tiny, so shipping fp32 costs little).
    Why (issue 40, benchmarks/results/rl_recipe_40.txt): the earlier SFT (300 steps at a constant
    3e-3, no hasty demonstrations) stopped mid-way through learning to copy a key, so its held-out
    score at version 0 swung between 0.35 and 0.99 with the SFT seed and even the XLA:CPU thread
    count, and RL from the weaker ones collapsed; decayed to 0, the SFT lands on the same policy
    (benchmarks/results/sft_converged.txt). From it, RL at 5e-4 removed the guessing but broke
    copying on the way (held-out 0.52 -> 0.40 at version 20: reads with no finish until the
    context filled, invalid calls 5 -> 181); at 3e-4 with a bf16 engine copy one of 5 seeds
    collapsed the same way late in the decay (valid calls 1.0 -> 0.41 from version 31); with the
    fp32 copy, or at 2e-4, that seed rose at every evaluation. The length term is difficulty-aware
    (rl.task.length_weights: easy 1, hard 0) with the weights of `lookup_env_config`; `--set
    rl.task.levels=easy,hard` adds hard tasks (a pointer to a second note: 3 tool calls)."""
    from composer_jax.rl.tasks.lookup import lookup_env_config, lookup_model_config
    rl = RLConfig(group_size=8, batch_groups=4, max_staleness=max_staleness, steps=40,
                  max_new_tokens=40, seq_len=192, loss_normalizer=1024.0, eval_greedy=False,
                  task=LookupTaskConfig(num_train_tasks=256, num_eval_tasks=256, max_turns=4,
                                        levels=("easy",), sft_steps=1600, sft_hasty=0.5,
                                        sft_schedule=Schedule.COSINE),
                  job=JobConfig(num_rollout_workers=32, checkpoint_every=10, eval_every=10),
                  weight_sync=WeightSyncConfig(full_snapshot_every=10, dtype=""))
    train = TrainConfig(steps=rl.steps, lr=3e-4, warmup_steps=5, schedule=Schedule.WSD,
                        decay_fraction=0.5, min_lr_ratio=0.1, weight_decay=0.0, grad_clip=1.0,
                        log_every=1)
    return dataclasses.replace(Config(), model=lookup_model_config(), rl=rl, train=train,
                               env=lookup_env_config())


def _config(max_staleness: int) -> Config:
    """rl.task=parity (`rl_async_parity`)."""
    from composer_jax.rl.toy_tasks import toy_model_config
    # the recipe of benchmarks/rl_learning_curve.py (issue 15): Adam at a constant 3e-3, Dr.GRPO
    # with loss_normalizer 64 (about one step's tokens), 4 tasks x 8 samples per step, 6 new
    # tokens per reply. Default: the unconditional parity variant (reply with even characters),
    # which a fresh tiny policy learns in ~60 versions; `--set rl.task.kinds=even,odd --set
    # rl.steps=300` is the conditional one (slower and less reliable: README)
    rl = RLConfig(group_size=8, batch_groups=4, max_staleness=max_staleness, steps=150,
                  max_new_tokens=6, seq_len=64, loss_normalizer=64.0,
                  task=ParityTaskConfig(num_train_tasks=64, num_eval_tasks=16, kinds=("even",)),
                  job=JobConfig(num_rollout_workers=32, checkpoint_every=25, eval_every=50),
                  weight_sync=WeightSyncConfig(full_snapshot_every=10))
    train = TrainConfig(steps=150, lr=3e-3, warmup_steps=0, schedule=Schedule.CONSTANT,
                        weight_decay=0.0, grad_clip=1.0, log_every=1)
    return dataclasses.replace(Config(), model=toy_model_config(), rl=rl, train=train)


def _coding_config(max_staleness: int) -> Config:
    """rl.task=coding: the policy is the repository's own `sft` run (the cpt_debug model and
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
    rl = RLConfig(group_size=4, batch_groups=2, max_staleness=max_staleness, steps=40,
                  max_new_tokens=320, seq_len=3072, loss_normalizer=1024.0, temperature=1.0,
                  task=CodingTaskConfig(num_train_tasks=12, num_eval_tasks=2),
                  job=JobConfig(num_rollout_workers=16, checkpoint_every=4, eval_every=8),
                  weight_sync=WeightSyncConfig(full_snapshot_every=10, dtype=""))
    train = TrainConfig(steps=rl.steps, lr=1e-4, warmup_steps=0, schedule=Schedule.CONSTANT,
                        weight_decay=0.0, grad_clip=1.0, log_every=1)
    env = dataclasses.replace(EnvConfig(), max_turns=4, command_timeout_s=10.0,
                              episode_time_s=600.0, use_embeddings=False,
                              num_tasks=rl.task.num_train_tasks,
                              kinds=("bug",), python_versions=(_python_version(),),
                              max_tasks_per_module=2, workers=2)
    ev = dataclasses.replace(EvalConfig(), max_turns=4, max_new_tokens=320, max_context=3072,
                             concurrency=2)
    return dataclasses.replace(base, rl=rl, train=train, env=env, eval=ev)


def _coding_ladder_config(max_staleness: int) -> Config:
    """rl.task=coding with rl.task.levels (the difficulty ladder, issue 41): `_coding_config` sized
    for ladder episodes (benchmarks/results/rl_coding_ladder.txt). A level-1 oracle episode is 5
    calls (run the failing test, read the window, edit, rerun, finish) of 30-85 generated tokens
    each; its prompt declares no tools (env.declare_tools=false: the policy learnt the protocol
    from its SFT demonstrations; the RL run adopts the SFT policy's prompt), which takes an episode
    from ~1.6k tokens (4 declared tools) to ~1.0k (1.1k at most), so 6 turns of up to 160 new
    tokens in 1536-token rows; held-out episodes (64 tasks of held-out modules) are sampled at
    T = 1 (rl.eval_greedy=false: an SFT policy with a habit taken on some episodes shows it in
    samples, not in its argmax) at versions 0 and 20 (an evaluation is 64 episodes, a version 8:
    on 2 shared cores the run is sized by episodes); Adam warmed up over 3
    versions to 3e-4, held, then decayed to 3e-5 over the second half (the lookup recipe);
    weights shipped to the engine in fp32."""
    base = _coding_config(max_staleness)
    rl = dataclasses.replace(
        base.rl, steps=20, max_new_tokens=160, seq_len=1536, eval_greedy=False,
        task=CodingTaskConfig(levels=(1,), num_train_tasks=240, num_eval_tasks=64,
                              ladder_train=240, ladder_heldout=64),
        job=dataclasses.replace(base.rl.job, checkpoint_every=5, eval_every=20))
    train = dataclasses.replace(base.train, steps=rl.steps, lr=3e-4, warmup_steps=3,
                                schedule=Schedule.WSD, decay_fraction=0.5, min_lr_ratio=0.1)
    env = dataclasses.replace(base.env, max_turns=6, declare_tools=False)
    return dataclasses.replace(base, rl=rl, train=train, env=env)


def _python_version() -> str:
    """The newest Python of the machine the environment can run tasks with."""
    from composer_jax.env.pythons import find_pythons
    found = find_pythons()
    if not found:
        return "3.12"
    return sorted(found, key=lambda v: tuple(map(int, v.split("."))))[-1]


def _family_defaults(cfg: Config):
    """The experiment settings of cfg's task family (`make(max_staleness) -> Config`), or None
    for the lookup family (the experiments' own defaults): coding (`_coding_ladder_config` when
    rl.task.levels is set), parity."""
    family = cfg.rl.task.family
    if family == "coding":
        return _coding_ladder_config if getattr(cfg.rl.task, "levels", ()) else _coding_config
    return {"parity": _config}.get(family)


def family_base(cfg: Config):
    """`registry.Experiment.rebase` of the RL experiments: `--set rl.task=coding|parity` (with
    `rl.task.levels=...` for the coding ladder) starts from that family's settings, the user's
    overrides applied on them (every key the user set wins, whatever its value; the family's
    `rl.task` section stays as the family sets it). None for the lookup family."""
    make = _family_defaults(cfg)
    if make is None:
        return None
    return make(cfg.rl.max_staleness), ("rl.task",)


def prepare(cfg: Config) -> Config:
    """The run's config resolved by its task family (a family's own experiment settings were
    applied when the overrides were parsed: `family_base`), in this order: a coding run with no
    initial policy given gets the cached `sft` run on its pool (`_with_sft_policy`); the family's
    `prepare` (coding: the pool, the initial policy and its model); `train.init_from`, the
    initial policy of every family (its run's model, or a ConfigError: `rl.initial_policy`);
    then, on the resolved model, that `inference.speculative` has the MTP modules it drafts with
    (a ConfigError before anything is built)."""
    from composer_jax.rl.initial_policy import resolve_init_from
    from composer_jax.rl.tasks import get
    from composer_jax.rl.tasks.coding import CodingFamily
    family = get(cfg.rl.task.family)
    if issubclass(family, CodingFamily) and not (cfg.rl.task.init_from or cfg.train.init_from):
        cfg = _with_sft_policy(cfg)
    cfg = resolve_init_from(family.prepare(cfg), family)
    cfg.inference.check_model(cfg.model.mtp_depth)   # inference.speculative needs an MTP head
    return cfg


def _with_sft_policy(cfg: Config) -> Config:
    """rl.task=coding with neither rl.task.init_from nor train.init_from: the task pool resolved
    (`rl.tasks.coding.ensure_pool`) and, as rl.task.init_from, the `sft` experiment run on it
    (cached by its config and the pool's manifest; built on first use: a few minutes on CPU)."""
    from composer_jax.api import save_config
    from composer_jax.config import to_dict
    from composer_jax.rl.tasks.coding import _cache, _key, ensure_pool
    pool = ensure_pool(cfg)
    exp = registry.get("sft")
    sft = exp.make_config()
    sft = dataclasses.replace(sft, data=dataclasses.replace(sft.data, sft_pool=str(pool),
                                                            cache_dir=cfg.data.cache_dir),
                              env=dataclasses.replace(cfg.env, pool_dir=str(pool)), seed=cfg.seed)
    manifest = (pool / "manifest.json").read_text() if (pool / "manifest.json").exists() else ""
    d = _cache(cfg) / "rl_sft" / _key(to_dict(sft), manifest)
    if not (d / "checkpoints" / str(sft.train.steps)).exists():     # missing or unfinished: (re)run
        print(f"rl.task=coding: building the initial policy (the `sft` experiment) in {d}",
              file=sys.stderr)
        d.mkdir(parents=True, exist_ok=True)
        save_config(sft, d / "config.json")
        exp.run(sft, d)
    task = dataclasses.replace(cfg.rl.task, init_from=str(d))
    return dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, pool_dir=str(pool)),
                               rl=dataclasses.replace(cfg.rl, task=task))


def make_store(cfg: Config, backend=None):
    """The weight store the trainer publishes to, from the run's backend (local: in-process
    transport; ray: Ray's object store)."""
    from composer_jax.rl.backend import make_backend
    from composer_jax.rl.settings import settings_from_config
    from composer_jax.rl.weights import WeightSyncSettings
    backend = backend or make_backend(settings_from_config(cfg))
    return backend.make_store(WeightSyncSettings(**dataclasses.asdict(cfg.rl.weight_sync)))


def _train(cfg: Config, workdir: pathlib.Path, stop) -> dict:
    """The run of a resolved config inside `stop_signals`: the family's run files, the driver on
    the chosen backend, then the plots."""
    from composer_jax.rl.backend import make_backend
    from composer_jax.rl.driver import run_rl
    from composer_jax.rl.family_eval import checkpoint_eval_fn
    from composer_jax.rl.plots import write_plots
    from composer_jax.rl.settings import settings_from_config
    from composer_jax.rl.task_program import task_program_spec
    from composer_jax.rl.tasks import family_of
    family = family_of(cfg)
    family.write_run_files(workdir)
    settings = settings_from_config(cfg)
    backend = make_backend(settings)
    try:
        summary = run_rl(task_program_spec(cfg), workdir, settings, make_store(cfg, backend),
                         stop_event=stop, eval_fn=checkpoint_eval_fn(cfg, family),
                         backend=backend)
    finally:
        backend.shutdown()
    write_plots(workdir, summary)
    return summary


def _resolve(cfg: Config, workdir: pathlib.Path) -> Config:
    """`prepare(cfg)`, saved to WORKDIR/config.json when it differs from what launch.py wrote
    (e.g. the family's own settings, the resolved pool, policy and model)."""
    resolved = prepare(cfg)
    if resolved != cfg:
        from composer_jax.api import save_config
        save_config(resolved, workdir / "config.json")
    return resolved


def run(cfg: Config, workdir: pathlib.Path) -> dict:
    from composer_jax.rl.driver import finished_version
    from composer_jax.rl.run_report import end_summary
    from composer_jax.runlog import read_metrics
    from composer_jax.stopping import stop_signals
    sandbox = _reward_sandbox(cfg)      # before building anything
    cfg = _resolve(cfg, workdir)        # once: everything below reads the resolved config
    done_at = finished_version(workdir, cfg.rl.steps)
    if done_at is not None:
        print(f"already finished at version {done_at} (rl.steps={cfg.rl.steps}): nothing to do; "
              f"summary {workdir / 'rl_summary.json'}, plots {workdir / 'plots'}. Raise rl.steps "
              f"to train on, or use another --workdir")
        return {"version": done_at, "already_finished": True}
    with stop_signals() as stop:
        summary = _train(cfg, workdir, stop)
    if sandbox:
        from composer_jax.env.trust import record_in_summary
        summary["reward_sandbox"] = sandbox
        record_in_summary(workdir / "rl_summary.json", sandbox)
    name = "rl_sync" if cfg.rl.max_staleness == 0 else "rl_async"
    print(end_summary(name, summary, workdir, read_metrics(workdir)))
    return summary


def _reward_sandbox(cfg: Config) -> str:
    """A family whose reward grades code (`grades_code`) refuses the fallback sandbox unless
    env.allow_unsandboxed_rewards=true (`env.trust`); returns what the summary records ("" when
    sandboxed or when the family grades no code)."""
    from composer_jax.rl.tasks import get
    if not getattr(get(cfg.rl.task.family), "grades_code", False):
        return ""
    from composer_jax.env.trust import require_sandboxed_rewards
    return require_sandboxed_rewards(cfg.env, f"rl.task={cfg.rl.task.family}")


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
                  lambda: _lookup_config(2), run, check_steps(lambda: _lookup_config(2)),
                  stoppable=True, rebase=family_base)
registry.register("rl_sync", "the rl_async job with rl.max_staleness=0 (synchronous RL baseline)",
                  lambda: _lookup_config(0), run, check_steps(lambda: _lookup_config(0)),
                  stoppable=True, rebase=family_base)
registry.register("rl_async_parity", "rl_async on the single-turn parity family (= rl_async "
                  "--set rl.task=parity with the parity settings)", lambda: _config(2), run,
                  check_steps(lambda: _config(2)), stoppable=True, rebase=family_base)
registry.register("rl_async_coding", "rl_async on sandboxed coding tasks (= rl_async --set "
                  "rl.task=coding): SFT-initialised policy, real tools, eval-suite evaluator",
                  lambda: _coding_config(2), run, check_steps(lambda: _coding_config(2)),
                  stoppable=True, rebase=family_base)
