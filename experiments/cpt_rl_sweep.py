"""cpt_rl_sweep: does held-out pretraining loss predict the held-out score after RL?

    python launch.py --experiment=cpt_rl_sweep --workdir=W [--set sweep.cells=b80-s1,...]

1. Pretraining: one run of `sweep.cpt_experiment`'s config (default cpt_debug, `sweep.cpt_set`
   overrides) trained as continued pretraining (`train.loop.train`, kind cpt) in W/cpt, to the largest budget, validating and checkpointing at every budget (or
   `sweep.cpt_dir`, an existing run). Each budget's checkpoint is copied to W/pretrained/step<B>.
2. RL: for every (budget, seed) cell the same RL recipe (the config's `rl` and `train` sections:
   the `rl_async` job) from that checkpoint, with that seed, in its own run directory
   W/cells/b<B>-s<S>, on the held-out stdlib completion family
   (`composer_jax.rl.tasks.stdlib_completion`: why it depends on pretraining is in its
   docstring). Finished cells are skipped; an interrupted one resumes; `sweep.cells` reruns the
   named cells from scratch (only those).
3. Report (`composer_jax.sweep.report`): W/sweep.json, W/sweep.png, W/sweep.txt with, per cell,
   the checkpoint's held-out validation loss, the held-out RL score at the end and the area
   under the held-out RL curve; Pearson and Spearman correlation over budgets with bootstrap
   intervals; a sweep with unfinished cells is labelled PARTIAL. The report is rewritten after
   every cell; `--set sweep.report_only=true` only rewrites it from what is on disk.
"""
from __future__ import annotations

import dataclasses
import math
import pathlib
import shutil
import sys

from composer_jax import registry
from composer_jax.config import (Config, JobConfig, RLConfig, Schedule, SweepConfig, TrainConfig,
                                 WeightSyncConfig, to_dict)
from composer_jax.config.sweep import cell_name
from composer_jax.errors import ConfigError

FAMILY = "composer_jax.rl.tasks.stdlib_completion"


def _config() -> Config:
    """The CPU default (README "Pretraining loss vs RL score"): 4 budgets of cpt_debug (40-320
    steps) x 2 RL seeds; RL: 4 completion tasks x 8 samples per step, Adam 1e-3 for 40 versions,
    32 held-out tasks scored greedily every 8 versions."""
    from composer_jax.rl.tasks.stdlib_completion import StdlibCompletionConfig
    from experiments.pretrain import _debug
    cpt = _debug()
    task = StdlibCompletionConfig(num_train_tasks=64, num_eval_tasks=32, prompt_tokens=48,
                                  target_tokens=4)
    rl = RLConfig(group_size=8, batch_groups=4, max_staleness=2, steps=40, max_new_tokens=4,
                  seq_len=64, loss_normalizer=32.0, temperature=1.0, task=task,
                  job=JobConfig(num_rollout_workers=32, checkpoint_every=10, eval_every=8),
                  weight_sync=WeightSyncConfig(full_snapshot_every=10, dtype=""))
    train = TrainConfig(steps=rl.steps, lr=1e-3, warmup_steps=0, schedule=Schedule.CONSTANT,
                        weight_decay=0.0, grad_clip=1.0, log_every=1)
    return dataclasses.replace(Config(), model=cpt.model, data=cpt.data, rl=rl, train=train,
                               sweep=SweepConfig())


def cpt_config(sw: SweepConfig) -> Config:
    """The pretraining run: `sweep.cpt_experiment`'s default with `sweep.cpt_set`, run to the
    largest budget, validating and checkpointing every gcd(budgets) steps and keeping them all."""
    from composer_jax.overrides import apply_overrides
    cfg = apply_overrides(registry.get(sw.cpt_experiment).make_config(), list(sw.cpt_set))
    g = math.gcd(*sw.budgets)
    train = dataclasses.replace(cfg.train, steps=sw.budgets[-1], eval_every=g, checkpoint_every=g,
                                keep_checkpoints=sw.budgets[-1] // g + 2)
    return dataclasses.replace(cfg, train=train)


def ensure_pretrained(cfg: Config, workdir: pathlib.Path) -> pathlib.Path:
    """The pretraining workdir (sweep.cpt_dir, else W/cpt, run or resumed until its last budget
    is saved)."""
    sw = cfg.sweep
    if sw.cpt_dir:
        return pathlib.Path(sw.cpt_dir)
    d = workdir / "cpt"
    if not (d / "checkpoints" / str(sw.budgets[-1])).exists():
        from composer_jax.api import save_config
        from composer_jax.train.loop import train
        pc = cpt_config(sw)
        d.mkdir(parents=True, exist_ok=True)
        save_config(pc, d / "config.json")
        result = train(pc, d, kind="cpt")        # the cpt experiments' training, without samples
        if result.interrupted:
            raise SystemExit("pretraining interrupted; rerun the same command to resume")
    return d


def snapshot(cpt_dir: pathlib.Path, budget: int, workdir: pathlib.Path) -> pathlib.Path:
    """W/pretrained/step<budget>: a run workdir whose only checkpoint is `budget` (what
    `rl.task.init_from` loads: config.json, tokenizer.json, checkpoints/<budget>)."""
    d = workdir / "pretrained" / f"step{budget}"
    if (d / "checkpoints" / str(budget)).exists():
        return d
    src = cpt_dir / "checkpoints" / str(budget)
    if not src.exists():
        raise ConfigError(f"{cpt_dir} has no checkpoint at step {budget}; it must checkpoint at "
                          f"every budget (sweep.cpt_dir) or be rerun without it")
    tmp = d.with_name(d.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "checkpoints").mkdir(parents=True)
    for f in ("config.json", "tokenizer.json"):
        shutil.copy2(cpt_dir / f, tmp / f)
    shutil.copytree(src, tmp / "checkpoints" / str(budget))
    tmp.replace(d)
    return d


def cell_config(cfg: Config, init_from: pathlib.Path, seed: int) -> Config:
    if cfg.rl.task.family != FAMILY:
        raise ConfigError(f"cpt_rl_sweep runs rl.task={FAMILY}, got {cfg.rl.task.family!r}")
    task = dataclasses.replace(cfg.rl.task, init_from=str(init_from))
    return dataclasses.replace(cfg, seed=seed, rl=dataclasses.replace(cfg.rl, task=task))


def run_cell(cfg: Config, cell_dir: pathlib.Path) -> None:
    from composer_jax.api import save_config
    from experiments.rl import run as run_rl
    cell_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, cell_dir / "config.json")
    run_rl(cfg, cell_dir)


def cells_to_run(sw: SweepConfig, workdir: pathlib.Path, steps: int) -> list[tuple[int, int]]:
    """The (budget, seed) cells to run now: the named `sweep.cells` (their directories are
    removed first: they rerun from scratch), else every cell whose RL run has not finished."""
    from composer_jax.sweep.cells import is_finished
    for name in sw.cells:
        shutil.rmtree(workdir / "cells" / name, ignore_errors=True)
    return [(b, s) for b, s in sw.all_cells()
            if (cell_name(b, s) in sw.cells if sw.cells
                else not is_finished(workdir / "cells" / cell_name(b, s), steps))]


def write(cfg: Config, workdir: pathlib.Path, cpt_dir: pathlib.Path) -> dict:
    """Reads every cell back and writes W/sweep.{json,png,txt} (PARTIAL while cells are missing;
    a budget whose validation loss is not logged yet has no finished cell)."""
    from composer_jax.sweep.cells import cell_result, val_loss_at
    from composer_jax.sweep.report import write_report
    sw, steps, rows = cfg.sweep, cfg.rl.steps, []
    metric = "heldout_" + FAMILY.rsplit(".", 1)[-1] + "_reward_mean"
    for b, s in sw.all_cells():
        try:
            loss = val_loss_at(cpt_dir, b)
        except FileNotFoundError:
            loss = float("nan")
        r = cell_result(workdir / "cells" / cell_name(b, s), b, s, loss, steps, metric)
        rows.append({**r, "finished": r["finished"] and math.isfinite(loss)})
    command = " ".join(["python"] + sys.argv) if sys.argv and sys.argv[0].endswith("launch.py") \
        else f"cpt_rl_sweep run(cfg, {workdir})"
    return write_report(workdir, rows, len(rows), to_dict(cfg), command, sw.bootstrap, sw.ci)


def run(cfg: Config, workdir: pathlib.Path) -> dict:
    from tqdm.auto import tqdm
    sw = cfg.sweep
    if sw.report_only:
        summary = write(cfg, workdir, pathlib.Path(sw.cpt_dir) if sw.cpt_dir else workdir / "cpt")
        print((workdir / "sweep.txt").read_text())
        return summary
    cpt_dir = ensure_pretrained(cfg, workdir)
    from composer_jax.sweep.cells import val_loss_at
    for b in sw.budgets:
        val_loss_at(cpt_dir, b)                 # every budget validated (else: a clear error)
        snapshot(cpt_dir, b, workdir)
    for b, s in tqdm(cells_to_run(sw, workdir, cfg.rl.steps), desc="sweep cells",
                     dynamic_ncols=True):
        run_cell(cell_config(cfg, workdir / "pretrained" / f"step{b}", s),
                 workdir / "cells" / cell_name(b, s))
        write(cfg, workdir, cpt_dir)             # a partial report after every cell
    summary = write(cfg, workdir, cpt_dir)
    print((workdir / "sweep.txt").read_text())
    return summary


registry.register("cpt_rl_sweep", "pretraining budgets x RL seeds: does held-out pretraining "
                  "loss predict the held-out score after RL? (sweep.json/png/txt)", _config, run)
