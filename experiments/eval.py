"""Evaluation experiments (composer_jax/eval).

  eval              run eval.policy (oracle | null | heuristic | a training run's workdir | a Hugging
                    Face directory) over the versioned held-out suite: K samples per task and prompt
                    style, episodes concurrent (models: RL's TokenAgent sessions on one inference
                    engine service, `inference.*` knobs); writes WORKDIR/eval.json, eval.md,
                    eval.png and a metrics.jsonl line
  eval_build_suite  build (or load) the suite; write WORKDIR/suite_manifest.json and the
                    content-disjointness report WORKDIR/disjointness.json (corpus candidates, RL pool
                    env.pool_dir, SFT pool data.sft_pool)
  eval_compare      several eval.json side by side (--set eval.compare=a/eval.json,b/eval.json):
                    WORKDIR/eval_compare.{md,json,png}

    python launch.py --experiment=eval --workdir=W --set eval.policy=heuristic --set eval.samples=2
"""
from __future__ import annotations

import json
import pathlib

from composer_jax import registry
from composer_jax.config import Config


def _config() -> Config:
    return Config()


def _workdir_name(cfg: Config) -> str:
    """eval_<policy>: oracle -> eval_oracle, runs/rl_async@20 -> eval_rl_async@20."""
    name = cfg.eval.policy.rstrip("/").rsplit("/", 1)[-1] or "policy"
    return "eval_" + "".join(c if c.isalnum() or c in "-_.@" else "_" for c in name)


def _run_family(cfg: Config, workdir: pathlib.Path) -> dict:
    """eval.policy=WORKDIR[@V] of an RL run of a family with its own held-out split (lookup,
    parity): that split, greedy, with standard errors."""
    from composer_jax.agent.rollout import atomic_write_bytes
    from composer_jax.rl.family_eval import evaluate_run
    from composer_jax.runlog import MetricsWriter
    row = evaluate_run(cfg.eval.policy)
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(workdir / "eval.json", json.dumps(row, indent=1).encode())
    with MetricsWriter(workdir) as m:
        m.write(0, {k: v for k, v in row.items() if isinstance(v, float)})
    print(f"held-out {row['task_family']} eval of {row['policy']} (version {row['version']}): "
          f"resolved {row['eval_resolved_rate']:.3f} +- {row['eval_resolved_se']:.3f}, reward "
          f"{row['eval_reward_mean']:.3f} +- {row['eval_reward_se']:.3f} over "
          f"{int(row['eval_num_tasks'])} tasks")
    print(json.dumps(row))
    return row


def _run(cfg: Config, workdir: pathlib.Path) -> dict:
    from composer_jax.rl.family_eval import has_own_heldout
    if cfg.eval.suite == "" and has_own_heldout(cfg.eval.policy):
        return _run_family(cfg, workdir)
    from composer_jax.eval.api import ensure_suite, evaluate
    from composer_jax.eval.policies import make_policy
    from composer_jax.eval.report import write_reports
    from composer_jax.runlog import MetricsWriter

    suite = ensure_suite(cfg)
    e = cfg.eval
    policy = make_policy(e.policy, cfg, max_new_tokens=e.max_new_tokens, temperature=e.temperature,
                         max_context=e.max_context, concurrency=e.concurrency, seed=cfg.seed)
    try:
        result = evaluate(cfg, policy, suite)
    finally:
        policy.close()
    paths = write_reports(result, workdir)
    s = result["summary"]
    with MetricsWriter(workdir) as m:
        m.write(0, {"eval_resolved_rate": s["all"]["resolved"],
                    **{f"eval_resolved_{k}": v["resolved"] for k, v in s.items() if k != "all"},
                    "eval_price": s["all"]["price"], "num_tasks": s["all"]["num_tasks"]})
    print(json.dumps({"suite_id": result["suite_id"], "policy": result["policy"]["name"],
                      "num_tasks": s["all"]["num_tasks"], "suite_tasks": suite.manifest["num_tasks"],
                      "median_lines_changed": suite.manifest["median_lines_changed"],
                      **{f"resolved_{k}": round(v["resolved"], 4) for k, v in s.items()},
                      "reports": {k: str(v) for k, v in paths.items()}}))
    return result


def _build(cfg: Config, workdir: pathlib.Path) -> dict:
    from composer_jax.env.tasks.pool import atomic_write_text
    from composer_jax.eval.api import ensure_suite
    from composer_jax.eval.disjoint import disjointness_report

    suite = ensure_suite(cfg)
    atomic_write_text(pathlib.Path(workdir) / "suite_manifest.json",
                      json.dumps(suite.manifest, indent=1))
    rl = pathlib.Path(cfg.env.pool_dir) if cfg.env.pool_dir else None
    sft = pathlib.Path(cfg.data.sft_pool) if cfg.data.sft_pool else None
    report = disjointness_report(suite.directory, rl_pool=rl, sft_pool=sft)
    report["suite_id"] = suite.suite_id
    atomic_write_text(pathlib.Path(workdir) / "disjointness.json", json.dumps(report, indent=1))
    m = suite.manifest
    print(json.dumps({"suite_id": suite.suite_id, "num_tasks": m["num_tasks"],
                      "categories": m["categories"], "median_lines_changed": m["median_lines_changed"],
                      "disjoint": report["disjoint"],
                      "checked": {k: v["files"] for k, v in report["sources"].items()}}))
    return report


def _compare(cfg: Config, workdir: pathlib.Path) -> dict:
    from composer_jax.errors import ConfigError
    from composer_jax.eval.report import write_comparison

    if len(cfg.eval.compare) < 1:
        raise ConfigError("eval_compare needs --set eval.compare=RUN1/eval.json,RUN2/eval.json")
    results, names = [], []
    for p in cfg.eval.compare:
        path = pathlib.Path(p)
        path = path / "eval.json" if path.is_dir() else path
        if not path.is_file():
            raise ConfigError(f"eval.compare: {p} is not an eval.json (or a directory holding one)")
        r = json.loads(path.read_text())
        results.append(r)
        pol = r["policy"]
        names.append(pol["name"] + (f"@{pol['step']}" if "step" in pol else ""))
    if len(set(names)) < len(names):
        names = [f"{n} ({i})" for i, n in enumerate(names)]
    paths = write_comparison(results, names, workdir)
    print(json.dumps({"compared": names, "reports": {k: str(v) for k, v in paths.items()}}))
    return {"names": names}


registry.register("eval", "evaluate eval.policy (oracle|null|heuristic|run dir|HF dir) on the held-out "
                  "suite: correctness, quality, cost, behaviour -> eval.json/md/png (in runs/eval_POLICY)",
                  _config, _run, workdir_name=_workdir_name)
registry.register("eval_build_suite", "build the versioned held-out evaluation suite and prove it "
                  "content-disjoint from corpus, RL pool and SFT pool", _config, _build)
registry.register("eval_compare", "compare several eval.json results side by side "
                  "(eval.compare=a,b)", _config, _compare)
