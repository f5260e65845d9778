"""High-level entry points: find or build the suite, evaluate a policy, and the RL evaluator's hook.

  ensure_suite(cfg)              the suite named by `cfg.eval` (built on first use: the evaluation
                                 task pool from held-out modules, then the suite from it)
  evaluate(cfg, policy)          runs a policy over the suite -> the eval.json dict
  eval_resolved_rate(model, tokenizer, cfg, num_tasks=4)
                                 the RL evaluator's call on new parameters: a few held-out tasks,
                                 detailed prompts, greedy -> {"eval_resolved_rate", ...}
  eval_checkpoint(source, cfg, num_tasks=4)
                                 the same for a run's workdir / an HF directory
"""
from __future__ import annotations

import dataclasses
import hashlib
import pathlib
import threading
import time

from composer_jax.data.config import resolved_cache_dir
from composer_jax.env.config import TASK_KINDS, Split
from composer_jax.env.tasks.generate import generate_pool
from composer_jax.env.tasks.pool import TaskPool
from composer_jax.eval.policies import ModelPolicy, load_model
from composer_jax.eval.report import build_result
from composer_jax.eval.runner import RunSettings, run_suite
from composer_jax.eval.sources import suite_builder_hash, task_generator_hash
from composer_jax.eval.suite import Suite, build_suite, load_suite, oracle_check
from composer_jax.heldout import HELDOUT_MODULES


def cache_dir(cfg) -> pathlib.Path:
    return pathlib.Path(resolved_cache_dir(cfg.data))


def pool_key(cfg, generator_hash: str | None = None) -> str:
    """Names the evaluation pool by what shapes it: the content hash of the task generators' code
    (`sources.task_generator_hash`, so editing a generator or anything it uses rebuilds the pool),
    task kinds, held-out modules, size, Python versions, seed."""
    gen = generator_hash if generator_hash is not None else task_generator_hash()
    spec = repr((gen, sorted(TASK_KINDS), sorted(HELDOUT_MODULES), cfg.eval.pool_tasks,
                 tuple(cfg.env.python_versions), cfg.env.task_seed))
    return hashlib.sha256(spec.encode()).hexdigest()[:10]


def eval_pool_dir(cfg) -> pathlib.Path:
    return pathlib.Path(cfg.eval.pool_dir) if cfg.eval.pool_dir else \
        cache_dir(cfg) / "eval_pool" / pool_key(cfg)


def suite_dir(cfg) -> pathlib.Path:
    if cfg.eval.suite_dir:
        return pathlib.Path(cfg.eval.suite_dir)
    return (cache_dir(cfg) / "eval_suite" /
            f"{cfg.eval.suite_name}-{cfg.eval.suite_size}-{pool_key(cfg)}-{suite_builder_hash()[:8]}")


def eval_env_config(cfg):
    """The environment settings of evaluation episodes and of the evaluation pool's generation."""
    return dataclasses.replace(cfg.env, split=Split.EVAL, kinds=TASK_KINDS,
                               num_tasks=cfg.eval.pool_tasks,
                               max_tasks_per_module=max(cfg.env.max_tasks_per_module, 16),
                               max_turns=cfg.eval.max_turns)


_LOADED: dict[tuple[str, int], Suite] = {}    # (suite dir, manifest mtime) -> loaded suite
_LOADED_LOCK = threading.Lock()


def ensure_suite(cfg, progress: bool = True) -> Suite:
    """Loads the configured suite, building the pool and the suite first when missing. A suite
    already loaded in this process is reused (keyed by directory and manifest mtime, so a rebuilt
    suite is read again); safe to call repeatedly and from several threads."""
    sdir = suite_dir(cfg)
    manifest = sdir / "manifest.json"
    if manifest.is_file():
        key = (str(sdir.resolve()), manifest.stat().st_mtime_ns)
        with _LOADED_LOCK:
            if key not in _LOADED:
                _LOADED.clear()               # keep only the newest suite
                _LOADED[key] = load_suite(sdir)
            return _LOADED[key]
    with _LOADED_LOCK:
        return _build_and_load(cfg, sdir, progress)


def _build_and_load(cfg, sdir: pathlib.Path, progress: bool) -> Suite:
    if not (sdir / "manifest.json").is_file():
        pdir = eval_pool_dir(cfg)
        if len(TaskPool(pdir)) < cfg.eval.pool_tasks:
            generate_pool(eval_env_config(cfg), pdir, progress=progress)
        build_suite(pdir, sdir, name=cfg.eval.suite_name, size=cfg.eval.suite_size,
                    min_median_lines=cfg.eval.min_median_lines,
                    verify=oracle_check(eval_env_config(cfg)))
    return load_suite(sdir)


def settings(cfg, **over) -> RunSettings:
    e = cfg.eval
    return dataclasses.replace(RunSettings(
        samples=e.samples, styles=tuple(e.styles), concurrency=e.concurrency,
        num_tasks=e.num_tasks, price_prompt_per_mtok=e.price_prompt_per_mtok,
        price_cached_per_mtok=e.price_cached_per_mtok,
        price_generated_per_mtok=e.price_generated_per_mtok, seed=cfg.seed), **over)


def evaluate(cfg, policy, suite: Suite | None = None, progress: bool = True, on_record=None,
             **over) -> dict:
    """Runs `policy` over the suite with `cfg.eval` settings (overridable); returns eval.json."""
    suite = suite or ensure_suite(cfg, progress)
    st = settings(cfg, **over)
    start = time.monotonic()
    records = run_suite(suite, policy, eval_env_config(cfg), st, progress, on_record)
    return build_result(records, suite=suite, policy=policy.describe(),
                        settings={**dataclasses.asdict(st), "styles": list(st.styles),
                                  "max_turns": cfg.eval.max_turns,
                                  "max_new_tokens": cfg.eval.max_new_tokens,
                                  "temperature": cfg.eval.temperature},
                        wall_s=time.monotonic() - start)


def eval_resolved_rate(model, tokenizer, cfg, *, num_tasks: int = 4, style: str = "detailed",
                       name: str = "checkpoint", suite: Suite | None = None,
                       engine=None) -> dict:
    """The RL evaluator's hook: greedy episodes of `model` (an nnx model) on the first `num_tasks`
    suite tasks with one prompt style, run as RL runs them (`agent.token_agent.TokenAgent` sessions on an
    inference engine service, `cfg.inference` knobs, `rl.summary_trigger_tokens`); returns
    {"eval_resolved_rate", "eval_partial", "eval_tasks", "eval_suite_id", "eval_price",
    "eval_generated_tokens"}.

    Callable repeatedly from a long-lived process (the RL trainer): the suite is loaded once per
    process (`ensure_suite`), jitted engine steps are shared by engines of the same model
    structure, and each call's engine is stopped before returning. `engine`: a started engine to
    run on instead (its current weights are evaluated and it is left running; `model` may then be
    None)."""
    e = cfg.eval
    policy = ModelPolicy(name, model, tokenizer, max_new_tokens=e.max_new_tokens, temperature=0.0,
                         max_context=e.max_context, concurrency=e.concurrency, seed=cfg.seed,
                         engine=engine, engine_cfg=cfg.inference,
                         summary_trigger_tokens=cfg.rl.summary_trigger_tokens)
    try:
        r = evaluate(cfg, policy, suite=suite, progress=False, samples=1, styles=(style,),
                     num_tasks=num_tasks)
    finally:
        policy.close()
    s = r["summary"]["all"]
    return {"eval_resolved_rate": s["resolved"], "eval_partial": s["partial"],
            "eval_tasks": int(s["num_tasks"]), "eval_suite_id": r["suite_id"],
            "eval_price": s["price"], "eval_generated_tokens": s["generated_tokens"]}


def eval_checkpoint(source: str, cfg, *, num_tasks: int = 4, style: str = "detailed",
                    suite: Suite | None = None) -> dict:
    """`eval_resolved_rate` of a saved checkpoint: a training run's workdir (newest checkpoint) or
    a Hugging Face directory with a tokenizer.json; adds "eval_step" when the source has one."""
    model, tokenizer, info = load_model(pathlib.Path(source), cfg)
    out = eval_resolved_rate(model, tokenizer, cfg, num_tasks=num_tasks, style=style,
                             name=info.get("model", "checkpoint"), suite=suite)
    if "step" in info:
        out["eval_step"] = info["step"]
    return out
