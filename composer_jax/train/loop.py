"""The training loop shared by the CPT, long-context and SFT experiments.

Builds (or loads from the cache) the corpus and tokenizer, the device mesh from `cfg.mesh` (the
first `mesh.num_devices` devices, or all), the model (fresh, from an HF directory, or from a previous
run's Orbax checkpoint via train.init_from) placed on the mesh by the rules table, the pure train
step jitted with those shardings, and runs it with tqdm progress, metrics.jsonl + TensorBoard, periodic validation, asynchronous checkpoints (resume is
exact: parameters, optimizer state, step and data-iterator position; rows logged after the resumed
checkpoint are dropped from metrics.jsonl and tb/), a clean stop on SIGTERM / SIGINT (the step
finishes, a checkpoint is saved, the plot written; `composer_jax.stopping`), and a loss-curve PNG
at the end. Rerunning a finished run says so and changes nothing.
"""
from __future__ import annotations

import dataclasses
import pathlib
import time
from typing import Any

import jax
from tqdm.auto import tqdm

from composer_jax import data
from composer_jax.config import Config
from composer_jax.data.tokenizer import load_tokenizer
from composer_jax.errors import ComposerError
from composer_jax.model.flops import flops_per_token
from composer_jax.parallel.mesh import make_mesh
from composer_jax.runlog import (MetricsWriter, StepProfiler, is_remote, metric_series,
                                 read_metrics, run_path)
from composer_jax.stopping import stop_signals
from composer_jax.train.checkpoint import Checkpointer
from composer_jax.train.mfu import measured_matmul_flops, peak_flops_per_device
from composer_jax.train.schedules import make_schedule
from composer_jax.train.step import build, build_fresh
from composer_jax.train.weights import load_weights, source_kind


@dataclasses.dataclass
class TrainResult:
    """What `train` returns. metrics: the last logged metrics (name -> float); state: the final
    TrainState (on the mesh); fns: the StepFns (merge, placement, steps); tokenizer: the run's
    tokenizer; interrupted: stopped early (SIGTERM / interrupt_at) after saving a checkpoint."""
    metrics: dict
    state: Any
    fns: Any
    tokenizer: Any
    interrupted: bool
    already_finished: bool = False

    def model(self):
        """The trained model as one host-resident nnx module (weights gathered off the mesh, in
        execution.param_dtype)."""
        params, buffers = jax.device_get((self.state.params, self.state.buffers))
        return self.fns.merge(params, buffers)


class NonFiniteLossError(ComposerError):
    """Too many consecutive steps with a NaN/Inf loss or gradient."""


def training_mesh(cfg: Config):
    """The mesh of `cfg.mesh` over the first `mesh.num_devices` devices (0 = all of them)."""
    devices = jax.devices()
    n = cfg.mesh.num_devices or len(devices)
    if n > len(devices):
        raise ComposerError(f"mesh.num_devices={n} but JAX sees {len(devices)} devices "
                            f"({devices[0].platform}); set mesh.num_devices=0 to use all of them")
    return make_mesh(cfg.mesh, devices=devices[:n], axis_type=cfg.mesh.axis_type)


def _build(cfg: Config, mesh):
    """(StepFns, initial TrainState): a fresh model (`build_fresh`; a previous run's weights are
    restored into it in `train`), or a Hugging Face checkpoint loaded on the host and then placed
    (`composer_jax.train.weights`)."""
    if source_kind(cfg.train.init_from) != "hf":
        return build_fresh(cfg, mesh)
    w = load_weights(cfg.train.init_from, cfg)
    return build(w.model(), cfg, mesh)


def _data(cfg: Config, workdir: pathlib.Path, kind: str, start_state):
    corpus = data.build_or_load_corpus(cfg.data)
    tokenizer = data.build_or_load_tokenizer(cfg.data, corpus, cfg.model.vocab_size)
    if jax.process_index() == 0:
        if is_remote(workdir):     # gs:// etc.: Tokenizer.save wants a local path
            (workdir / "tokenizer.json").write_text(tokenizer.hf.to_str())
        else:
            tokenizer.save(workdir / "tokenizer.json")
    make = data.make_sft_iterator if kind == "sft" else data.make_train_iterator
    it = make(cfg.data, tokenizer, cfg.model.mtp_depth, jax.process_index(), jax.process_count(),
              start_state, corpus=corpus)
    evals = data.make_eval_batches(cfg.data, tokenizer, cfg.model.mtp_depth, jax.process_index(),
                                   jax.process_count(), corpus=corpus)
    n_eval = min(cfg.train.eval_batches, len(evals))
    eval_batches = [b for _, b in zip(range(n_eval), evals)]
    return tokenizer, it, eval_batches


def evaluate(fns, state, batches) -> float:
    """Mean validation cross-entropy per token over `batches`."""
    ce = tok = 0.0
    for b in batches:
        m = fns.eval_step(state, b)
        ce += float(m["ce_sum"])
        tok += float(m["tokens"])
    return ce / max(tok, 1.0)


def plot_curves(workdir: pathlib.Path) -> pathlib.Path | None:
    """plots/loss.png: training loss, CE, MTP loss and validation loss against step."""
    rows = read_metrics(workdir)
    if not rows:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, style in (("ce_loss", ".-"), ("mtp_loss", ".:"), ("val_loss", "o--")):
        xs, ys = metric_series(rows, key)
        if xs:                   # markers: the logged (measured) steps
            ax.plot(xs, ys, style, label=key, markersize=3 if key != "val_loss" else 5)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(f"{workdir.name}: training and validation loss")
    ax.grid(alpha=0.3)
    ax.legend()
    out = workdir / "plots" / "loss.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    with out.open("wb") as f:      # any epath (gs://...) as well as a local path
        fig.savefig(f, format="png", dpi=110)
    plt.close(fig)
    return out


def train(cfg: Config, workdir: pathlib.Path, kind: str = "cpt",
          interrupt_at: int | None = None) -> TrainResult:
    """Runs (or resumes) training; returns a TrainResult (the last logged metrics, the state).

    interrupt_at: behave as if SIGTERM arrived during that step (tests of the resume path).
    """
    workdir = run_path(workdir)
    tc = cfg.train
    mesh = training_mesh(cfg)
    fns, state = _build(cfg, mesh)
    ckpt = Checkpointer(workdir / "checkpoints", cfg, tc.checkpoint_every, tc.keep_checkpoints)
    restored = ckpt.restore_latest(state)
    if restored is None and source_kind(tc.init_from) == "run":
        # Start a new stage (e.g. long-context extension) from another run's latest weights: the
        # parameters and router biases carry over; optimizer state, step and data start afresh.
        w = load_weights(tc.init_from, cfg, template=state)
        state = state.replace(params=w.params, buffers=w.buffers,
                              opt_state=fns.init_opt_state(w.params))
        print(f"initialised from {tc.init_from} (step {w.step})")
    data_state = None
    if restored is not None:
        state, data_state, step = restored
        if step >= tc.steps:
            ckpt.close()
            rows = read_metrics(workdir)
            print(f"already finished at step {step} (train.steps={tc.steps}): nothing to do; "
                  f"checkpoint {ckpt.directory / str(step)}, metrics {workdir / 'metrics.jsonl'}. "
                  f"Raise train.steps to train on, or use another --workdir")
            tok = workdir / "tokenizer.json"
            return TrainResult(metrics={k: v for k, v in (rows[-1] if rows else {}).items()
                                        if isinstance(v, float)},
                               state=state, fns=fns,
                               tokenizer=load_tokenizer(tok) if tok.exists() else None,
                               interrupted=False, already_finished=True)
        print(f"resumed from {ckpt.directory} at step {step}")
    tokenizer, it, eval_batches = _data(cfg, workdir, kind, data_state)
    eval_batches = [fns.place_batch(b) for b in eval_batches]
    flops_tok = flops_per_token(cfg.model, cfg.data.seq_len)["total"]
    peak, peak_src = peak_flops_per_device()
    # CPU: besides the theoretical peak, the matmul rate this build achieves here (not a peak)
    matmul_rate = None if peak_src.startswith("spec sheet") else measured_matmul_flops()
    n_dev = mesh.size
    lr_at = make_schedule(tc)
    start = int(state.step)
    sizes = {a: n for a, n in zip(mesh.axis_names, mesh.axis_sizes) if n > 1}
    print(f"mesh: {n_dev} {mesh.devices.flat[0].platform} device(s) {sizes or ''} "
          f"rules {cfg.mesh.rules}")
    print(f"training {cfg.model.name} for {tc.steps} steps from step {start}; "
          f"{flops_tok:.3g} FLOPs/token; peak {peak:.3g} FLOP/s/device ({peak_src})"
          + (f"; achieved matmul rate {matmul_rate:.3g} FLOP/s" if matmul_rate else ""))
    lead = jax.process_index() == 0          # the one process that writes logs and plots
    writer = MetricsWriter(workdir, enabled=lead, config=cfg,
                           resume_from=start if restored is not None else None)
    profiler = StepProfiler(workdir, tc.profile_steps, enabled=lead)
    last: dict = {}
    done = start
    t_log, tokens_since = time.perf_counter(), 0
    pbar = tqdm(total=tc.steps, initial=start, desc=workdir.name, dynamic_ncols=True,
                disable=not lead)
    stop_ctx = stop_signals()
    stop = stop_ctx.__enter__()
    try:
        for step in range(start, tc.steps):
            b = fns.place_batch(next(it))
            profiler.start(step + 1)
            state, m = fns.train_step(state, b)
            profiler.stop(step + 1, m)
            tokens_since += int(b["tokens"].size)      # global rows x seq_len
            done = step + 1
            if int(state.nonfinite_streak) >= tc.max_nonfinite_steps:
                raise NonFiniteLossError(
                    f"{int(state.nonfinite_streak)} consecutive steps had a non-finite loss or "
                    f"gradient (last at step {done}); updates were skipped. Lower train.lr, enable "
                    f"train.z_loss, or check the data; the last good checkpoint is in "
                    f"{ckpt.directory}")
            log_now = done % tc.log_every == 0 or done == tc.steps or done == start + 1
            eval_now = done % tc.eval_every == 0 or done == tc.steps or done == start + 1
            if log_now or eval_now:
                m = {k: float(v) for k, v in jax.device_get(m).items()}
                dt = time.perf_counter() - t_log
                tps = tokens_since / dt
                m.update(tokens_per_sec=tps, mfu=tps * flops_tok / (peak * n_dev),
                         **({"frac_of_achieved_matmul_rate": tps * flops_tok / matmul_rate}
                            if matmul_rate else {}),
                         lr=float(lr_at(step)), skipped_total=float(state.nonfinite_total))
                if eval_now and eval_batches:
                    m["val_loss"] = evaluate(fns, state, eval_batches)
                writer.write(done, m)
                last = m
                pbar.set_postfix({k: f"{m[k]:.3f}" for k in ("loss", "val_loss") if k in m})
                t_log, tokens_since = time.perf_counter(), 0
            saved = ckpt.save(done, state, it.get_state(), force=done == tc.steps)
            pbar.update(1)
            if interrupt_at is not None and done == interrupt_at:
                stop.set("interrupt_at")
            if stop.requested:
                if not saved:      # this step's checkpoint may already be on its way
                    ckpt.save(done, state, it.get_state(), force=True)
                ckpt.wait()
                print(f"{stop.describe()}: stopped at step {done}/{tc.steps}; checkpoint "
                      f"{ckpt.directory / str(done)}, metrics {workdir / 'metrics.jsonl'}, plot "
                      f"{workdir / 'plots' / 'loss.png'}; rerun the same command to resume")
                break
    finally:
        stop_ctx.__exit__(None, None, None)
        pbar.close()
        profiler.close()
        writer.close()
        ckpt.close()
    png = plot_curves(workdir) if lead else None
    if png:
        print(f"loss curve: {png}")
    return TrainResult(metrics=last, state=state, fns=fns, tokenizer=tokenizer,
                       interrupted=done < tc.steps)
