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
import time

from composer_jax.env.config import TASK_KINDS, Split
from composer_jax.eval.runner import RunSettings, run_suite
from composer_jax.eval.suite import Suite, build_suite, load_suite
from composer_jax.heldout import HELDOUT_MODULES


def cache_dir(cfg) -> pathlib.Path:
    from composer_jax.data.config import resolved_cache_dir
    return pathlib.Path(resolved_cache_dir(cfg.data))


# Bumped when the task generators change what they produce (2: refactor and large_feature kinds).
EVAL_POOL_VERSION = 2


def pool_key(cfg) -> str:
    """Names the evaluation pool by what shapes it: generator version, task kinds, held-out
    modules, size, Python versions, seed."""
    spec = repr((EVAL_POOL_VERSION, sorted(TASK_KINDS), sorted(HELDOUT_MODULES),
                 cfg.eval.pool_tasks, tuple(cfg.env.python_versions), cfg.env.task_seed))
    return hashlib.sha256(spec.encode()).hexdigest()[:10]


def eval_pool_dir(cfg) -> pathlib.Path:
    return pathlib.Path(cfg.eval.pool_dir) if cfg.eval.pool_dir else \
        cache_dir(cfg) / "eval_pool" / pool_key(cfg)


def suite_dir(cfg) -> pathlib.Path:
    if cfg.eval.suite_dir:
        return pathlib.Path(cfg.eval.suite_dir)
    return cache_dir(cfg) / "eval_suite" / f"{cfg.eval.suite_name}-{cfg.eval.suite_size}-{pool_key(cfg)}"


def eval_env_config(cfg):
    """The environment settings of evaluation episodes and of the evaluation pool's generation."""
    return dataclasses.replace(cfg.env, split=Split.EVAL, kinds=TASK_KINDS,
                               num_tasks=cfg.eval.pool_tasks,
                               max_tasks_per_module=max(cfg.env.max_tasks_per_module, 16),
                               max_turns=cfg.eval.max_turns)


def ensure_suite(cfg, progress: bool = True) -> Suite:
    """Loads the configured suite, building the pool and the suite first when missing."""
    sdir = suite_dir(cfg)
    if not (sdir / "manifest.json").is_file():
        from composer_jax.env.tasks.generate import generate_pool
        from composer_jax.env.tasks.pool import TaskPool
        pdir = eval_pool_dir(cfg)
        if len(TaskPool(pdir)) < cfg.eval.pool_tasks:
            generate_pool(eval_env_config(cfg), pdir, progress=progress)
        build_suite(pdir, sdir, name=cfg.eval.suite_name, size=cfg.eval.suite_size,
                    min_median_lines=cfg.eval.min_median_lines)
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
    from composer_jax.eval.report import build_result
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
                       name: str = "checkpoint", suite: Suite | None = None) -> dict:
    """The RL evaluator's hook: greedy episodes of `model` (an nnx model) on the first `num_tasks`
    suite tasks with one prompt style; returns {"eval_resolved_rate", "eval_partial",
    "eval_tasks", "eval_suite_id", "eval_price", "eval_generated_tokens"}."""
    from composer_jax.eval.policies import ModelPolicy
    e = cfg.eval
    policy = ModelPolicy(name, model, tokenizer, max_new_tokens=e.max_new_tokens, temperature=0.0,
                         max_context=e.max_context, concurrency=e.concurrency, seed=cfg.seed)
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
    from composer_jax.eval.policies import load_model
    model, tokenizer, info = load_model(pathlib.Path(source), cfg)
    out = eval_resolved_rate(model, tokenizer, cfg, num_tasks=num_tasks, style=style,
                             name=info.get("model", "checkpoint"), suite=suite)
    if "step" in info:
        out["eval_step"] = info["step"]
    return out
