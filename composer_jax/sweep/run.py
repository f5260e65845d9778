"""`launch.py --experiment=NAME --sweep=SPEC`: one trial per point of a grid (`grid.py`), each a
`launch.py` run of the experiment in its own workdir SWEEP_DIR/<point name>, started from the
sweep's base config (SWEEP_DIR/config.json: the experiment's default with the command line's
`--config.*` flags) with the point's keys set on top.

Trials run one after another here (`--sweep_backend=local`) or as Ray Tune trials on a Ray
cluster (`--sweep_backend=ray`; `--ray_address` "" starts a local one, stopped at the end).
A trial that finished (SWEEP_DIR/<point>/trial.json) is not run again, so rerunning the command
resumes the sweep; a failed trial is run again (its own run resumes from its checkpoints). Every
point is validated before any trial starts. At the end SWEEP_DIR/sweep.md, sweep.json and
sweep.png compare the trials (`table.py`). With train.wandb_project set, the trials share the W&B
group SWEEP_DIR's name (unless train.wandb_group is set).
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

from composer_jax.api import save_config
from composer_jax.config import SECTION_PRESETS
from composer_jax.config.flags import NAME, parse_config
from composer_jax.errors import ComposerError
from composer_jax.rerun import check_rerun
from composer_jax.runlog import run_path
from composer_jax.sweep.grid import Grid, parse_grid, point_name
from composer_jax.sweep.table import choose_metrics, last_values, write_table

ROOT = pathlib.Path(__file__).resolve().parents[2]
DONE = "trial.json"
_ENV_VARS = ("JAX_PLATFORMS", "XLA_FLAGS", "COMPOSER_JAX_CACHE", "PYTHONPATH", "WANDB_MODE",
             "WANDB_SILENT", "WANDB_API_KEY")


def run_trial(cmd: list[str], trial_dir: str) -> dict:
    """Runs one trial's launch.py command (output to TRIAL/log.txt); on success writes TRIAL/
    trial.json, the mark that it is finished. Returns {returncode, seconds}."""
    d = pathlib.Path(trial_dir)
    d.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with open(d / "log.txt", "a") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    rec = {"returncode": rc, "seconds": round(time.time() - t0, 1), "command": cmd}
    if rc == 0:
        (d / DONE).write_text(json.dumps(rec, indent=1))
    return rec


def _ray_trial(config: dict) -> None:
    """A Ray Tune function trainable: one trial, its final metrics reported to Tune."""
    from ray import tune
    rec = run_trial(config["trial"]["cmd"], config["trial"]["dir"])
    tune.report({"returncode": rec["returncode"], "seconds": rec["seconds"],
                 **last_values(config["trial"]["dir"])})


def _run_ray(todo: list[dict], sweep_dir: pathlib.Path, address: str, parallel: int) -> None:
    import ray
    from ray import tune
    started = not ray.is_initialized()
    if started:
        env = {k: os.environ[k] for k in _ENV_VARS if k in os.environ}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
        kw = dict(runtime_env={"env_vars": env}, log_to_driver=False)
        if address:
            ray.init(address=address, **kw)
        else:
            ray.init(num_cpus=max(parallel, 1), include_dashboard=False,
                     _temp_dir=f"/tmp/cj_ray_{os.getpid()}", **kw)
    try:
        tuner = tune.Tuner(
            tune.with_resources(_ray_trial, {"cpu": 1}),
            param_space={"trial": tune.grid_search(todo)},
            tune_config=tune.TuneConfig(max_concurrent_trials=parallel),
            run_config=tune.RunConfig(name="tune", storage_path=str(sweep_dir / "ray_tune"),
                                      verbose=0))
        tuner.fit()
    finally:
        if started:
            ray.shutdown()


def run_sweep(exp, specs: list[str], cfg, workdir: str | None, backend: str = "local",
              metrics: list[str] | None = None, ray_address: str = "", parallel: int = 1,
              rewrite: bool = False) -> list[dict]:
    """Runs the sweep (module docstring) of experiment `exp` from base config `cfg`; returns the
    table's rows."""
    grid: Grid = parse_grid(specs)
    sweep_dir = run_path(workdir or f"runs/{exp.name}_sweep")
    if "://" in str(sweep_dir):
        raise ComposerError("--sweep needs a local workdir (trials run as local processes)")
    points = grid.points()
    for point in points:                  # every point valid before anything runs
        pcfg = parse_config(cfg, [f"--{NAME}.{k}={v}" for k, v in point], SECTION_PRESETS)
        if exp.check is not None:
            exp.check(pcfg)
    names = [point_name(p) for p in points]
    if len(set(names)) != len(names):
        raise ComposerError(f"two sweep points share a trial name: {names}")
    check_rerun(cfg, sweep_dir, rewrite=rewrite)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, sweep_dir / "config.json")
    extra = []
    if cfg.train.wandb_project and not cfg.train.wandb_group:
        extra.append(f"--{NAME}.train.wandb_group={sweep_dir.name}")
    trials = []
    for point, name in zip(points, names):
        d = sweep_dir / name
        cmd = [sys.executable, str(ROOT / "launch.py"), f"--experiment={exp.name}",
               f"--config={sweep_dir / 'config.json'}", f"--workdir={d}",
               *[f"--{NAME}.{k}={v}" for k, v in point], *extra]
        trials.append({"name": name, "point": point, "dir": str(d), "cmd": cmd,
                       "done_before": (d / DONE).exists()})
    todo = [t for t in trials if not t["done_before"]]
    print(f"sweep {sweep_dir}: {len(trials)} trials, {len(trials) - len(todo)} finished earlier "
          f"(not rerun), {len(todo)} to run ({backend})", flush=True)
    if todo and backend == "ray":
        _run_ray([{"cmd": t["cmd"], "dir": t["dir"]} for t in todo], sweep_dir, ray_address,
                 parallel)
    elif todo:
        for i, t in enumerate(todo, 1):
            print(f"  trial {i}/{len(todo)} {t['name']}: running (log {t['dir']}/log.txt)",
                  flush=True)
            rec = run_trial(t["cmd"], t["dir"])
            print(f"  trial {t['name']}: " + ("done" if rec["returncode"] == 0 else
                  f"FAILED (exit {rec['returncode']})") + f" in {rec['seconds']:.0f} s", flush=True)
    rows = [_row(t) for t in trials]
    keys = [k for k, _ in grid.axes]
    table = write_table(rows, keys, choose_metrics(rows, grid.metrics or tuple(metrics or ())),
                        sweep_dir)
    print(table)
    print(f"(table: {sweep_dir / 'sweep.md'}, plot: {sweep_dir / 'sweep.png'})")
    failed = [r["trial"] for r in rows if not r["status"].startswith("done")]
    if failed:
        raise ComposerError(f"{len(failed)} of {len(rows)} trials did not finish: {failed}; see "
                            f"their log.txt; rerunning the command reruns only those")
    return rows


def _row(t: dict) -> dict:
    d = pathlib.Path(t["dir"])
    status = "failed"
    if (d / DONE).exists():
        status = "done"
    elif (d / "log.txt").exists():
        lines = (d / "log.txt").read_text().strip().splitlines()
        status = f"failed: {lines[-1][:80]}" if lines else "failed"
    secs = json.loads((d / DONE).read_text())["seconds"] if (d / DONE).exists() else None
    return {"trial": t["name"], "point": dict(t["point"]), "status": status, "seconds": secs,
            "metrics": last_values(d)}
