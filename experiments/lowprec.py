"""`lowprec_loss_gap`: the same model, data, seed and tokens trained in BF16, MXFP8 and NVFP4.

Writes WORKDIR/{bf16,mxfp8,nvfp4}/ (each a full training run), WORKDIR/plots/loss_gap.png with the
three validation/training curves, and WORKDIR/loss_gap.json + a printed table of final validation
losses and their relative gaps to BF16. Targets (published anchors): MXFP8 within 0.5% and NVFP4
within 2% of BF16's final validation loss.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib

from composer_jax import registry
from composer_jax.config import Config, Optimizer, Precision

PRECISIONS = (Precision.BF16, Precision.MXFP8, Precision.NVFP4)


def _config() -> Config:
    from experiments.pretrain import _small

    cfg = _small()
    # pinned to the settings of the committed result (AdamW, 8 x 256 tokens per step), whatever
    # cpt_small's own optimizer and batch are
    data = dataclasses.replace(cfg.data, global_batch_size=8)
    train = dataclasses.replace(cfg.train, steps=150, warmup_steps=15, eval_every=50,
                                log_every=10, checkpoint_every=50, optimizer=Optimizer.ADAMW,
                                lr=2e-3)
    # the last block (and MTP) stays BF16, as in the NVFP4 recipe
    execution = dataclasses.replace(cfg.execution, quant_bf16_last_blocks=1)
    return dataclasses.replace(cfg, data=data, train=train, execution=execution)


def plot_gap(workdir: pathlib.Path, runs: dict[str, list[dict]]) -> pathlib.Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    from composer_jax.runlog import metric_series

    for name, rows in runs.items():
        ax1.plot(*metric_series(rows, "ce_loss"), label=name)
        ax2.plot(*metric_series(rows, "val_loss"), "o-", label=name, markersize=3)
    for ax, title in ((ax1, "training CE"), (ax2, "validation loss")):
        ax.set_xlabel("step")
        ax.set_ylabel("nats/token")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    out = workdir / "plots" / "loss_gap.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _run(cfg: Config, workdir: pathlib.Path) -> None:
    from composer_jax.runlog import read_metrics
    from composer_jax.train.loop import train

    runs = {}
    for p in PRECISIONS:
        sub = dataclasses.replace(cfg, execution=dataclasses.replace(cfg.execution, precision=p))
        print(f"=== {p.value} ===")
        train(sub, workdir / p.value)
        runs[p.value] = read_metrics(workdir / p.value)
    from composer_jax.runlog import metric_series
    final = {name: metric_series(rows, "val_loss")[1][-1] for name, rows in runs.items()}
    base = final["bf16"]
    table = {name: {"final_val_loss": v, "rel_gap_vs_bf16": (v - base) / base}
             for name, v in final.items()}
    targets = {"mxfp8": 0.005, "nvfp4": 0.02}
    for name, t in targets.items():
        table[name]["target"] = t
        # |gap|: a large gain over bf16 is as suspicious as a large loss
        table[name]["meets_target"] = abs(table[name]["rel_gap_vs_bf16"]) <= t
    (workdir / "loss_gap.json").write_text(json.dumps(
        {"steps": cfg.train.steps, "tokens": cfg.train.steps * cfg.data.global_batch_size *
         cfg.data.seq_len, "seed": cfg.seed, "results": table}, indent=2))
    png = plot_gap(workdir, runs)
    print(f"{'precision':<10}{'final val loss':>16}{'gap vs bf16':>14}{'target':>9}")
    for name, row in table.items():
        tgt = f"{row['target']:.1%}" if "target" in row else "-"
        print(f"{name:<10}{row['final_val_loss']:>16.4f}{row['rel_gap_vs_bf16']:>14.2%}{tgt:>9}")
    print(f"plot: {png}")


registry.register("lowprec_loss_gap", "the `small` config trained in bf16, mxfp8 and nvfp4 on the "
                  "same tokens; loss curves and final validation-loss gaps", _config, _run)
