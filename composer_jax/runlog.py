"""Run outputs: `metrics.jsonl` (one JSON object per logged step, with `step` and `time`),
TensorBoard events under `tb/`, and optionally a Weights & Biases run, all for one run workdir.

A workdir is used as given: a local path, or any URL that etils.epath / Orbax accept (`gs://bucket/
run`, `s3://...`). `run_path` turns the text into the path object the rest of the code joins with
`/`; nothing turns a URL into a local directory. Object stores cannot append, so on them
`metrics.jsonl` and the TensorBoard event file are kept in memory and rewritten whole on each flush
(every `flush_every_s` seconds and at close).

Resume hygiene: a run that resumes from step N opens its writer with `resume_from=N`; rows past N
(written after that checkpoint by the run that was stopped or killed) are dropped from
metrics.jsonl, and tb/ is rewritten from the kept rows, so every consumer sees each step once.
At close metrics.jsonl is compacted: one row per step, ascending (rows of the same step, e.g. an RL
version's trainer row and its held-out evaluation, merged).
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import os
import pathlib
import sys
import time

from composer_jax.config import to_dict
from composer_jax.errors import ConfigError


def is_remote(path) -> bool:
    """Whether `path` is a URL (gs://, s3://, ...) rather than a local path."""
    return "://" in os.fspath(path)


def run_path(path):
    """A run directory as given: a local path becomes an absolute `pathlib.Path`; a URL becomes an
    `etils.epath.Path` with the URL intact (never `pathlib.Path("gs://b")`, which is "gs:/b")."""
    if is_remote(path):
        from etils import epath
        return epath.Path(os.fspath(path))
    return pathlib.Path(path).absolute()


class _BufferedObject:
    """A write-only file on an object store: bytes accumulate and each flush rewrites the object."""

    def __init__(self, path, initial: bytes = b""):
        self.path = run_path(path)
        self.buffer = io.BytesIO()
        self.buffer.write(initial)
        self._dirty = bool(initial)

    def write(self, data) -> None:
        self.buffer.write(data.encode() if isinstance(data, str) else data)
        self._dirty = True

    def flush(self) -> None:
        if self._dirty:
            self.path.write_bytes(self.buffer.getvalue())
            self._dirty = False

    def close(self) -> None:
        self.flush()


class _EpathRecordWriterFactory:
    """tensorboardX writer factory for URL logdirs, through etils.epath (so gs:// needs gcsfs or
    TensorFlow, like Orbax, instead of google-cloud-storage)."""

    def open(self, path):
        return _BufferedObject(path)

    def directory_check(self, path):
        run_path(path).mkdir(parents=True, exist_ok=True)


def _register_tensorboard_schemes() -> None:
    from tensorboardX import record_writer
    for scheme in ("gs", "s3", "az", "hf", "memory"):
        record_writer.register_writer_factory(scheme, _EpathRecordWriterFactory())


class WandbWriter:
    """Logs scalar metrics to a Weights & Biases run (`train.wandb_project`; `train.wandb_mode`
    "offline" writes under the workdir for a later `wandb sync`). The run id is derived from the
    workdir, so a resumed run continues the same W&B run."""

    def __init__(self, project: str, workdir, config: dict | None = None, mode: str = "online",
                 group: str = ""):
        try:
            import wandb
        except ImportError:
            raise ConfigError(f"train.wandb_project={project!r} needs the wandb package: "
                              f"pip install -e '.[wandb]' (or set train.wandb_project='')") from None
        workdir = run_path(workdir)
        local = None if is_remote(workdir) else str(workdir)
        if local:
            os.makedirs(local, exist_ok=True)
        run_id = hashlib.sha256(str(workdir).encode()).hexdigest()[:16]
        self._run = wandb.init(project=project, dir=local, config=config, mode=mode,
                               id=run_id, name=workdir.name, resume="allow", reinit="finish_previous",
                               group=group or None)

    @property
    def run(self):
        return self._run

    def write(self, step: int, metrics: dict) -> None:
        row = {k: v for k, v in metrics.items() if k not in ("step", "time") and
               isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
        self._run.log(row, step=int(step))

    def close(self) -> None:
        self._run.finish()


def run_config_dict(workdir) -> dict | None:
    """The config.json that launch.py wrote into WORKDIR (as a dict), or None: a writer made
    without `config` (e.g. the RL driver's) still follows the run's train.wandb_project."""
    path = run_path(workdir) / "config.json"
    try:
        return json.loads(path.read_text()) if path.exists() else None
    except (OSError, ValueError):
        return None


class MetricsWriter:
    """Appends metrics to WORKDIR/metrics.jsonl, WORKDIR/tb (tensorboardX) and, when `config` (or,
    without it, the run's WORKDIR/config.json) has a `train.wandb_project`, to Weights & Biases
    (in the W&B group `train.wandb_group`).

    enabled=False (every process but the first of a multi-host run) writes nothing.
    `live=True` also prints each row (for notebooks, where a progress bar hides the numbers).
    `resume_from=N`: the run resumes from step N (module docstring: rows past N are dropped)."""

    def __init__(self, workdir, tensorboard: bool = True, enabled: bool = True, config=None,
                 flush_every_s: float = 30.0, live: bool = False, resume_from: int | None = None):
        self.workdir = run_path(workdir)
        self._file = self._tb = self._wandb = None
        self._remote = is_remote(self.workdir)
        self._flush_every_s = flush_every_s
        self._last_flush = time.monotonic()
        self._live = live
        if not enabled:
            return
        self.workdir.mkdir(parents=True, exist_ok=True)
        path = self.workdir / "metrics.jsonl"
        kept = None
        if resume_from is not None:
            kept = compact_metrics(self.workdir, upto=resume_from)
            if tensorboard:
                clear_tensorboard(self.workdir)
        if self._remote:
            self._file = _BufferedObject(path, path.read_bytes() if path.exists() else b"")
        else:
            self._file = open(path, "a", buffering=1)
        if tensorboard:
            from tensorboardX import SummaryWriter
            if self._remote:
                _register_tensorboard_schemes()
            self._tb = SummaryWriter(str(self.workdir / "tb"))
            if kept:
                replay_rows(self._tb, kept)      # one event file: the kept rows, then new ones
        conf = run_config_dict(self.workdir) if config is None else None
        if config is not None:
            conf = to_dict(config)
        tc = (conf or {}).get("train") or {}
        if tc.get("wandb_project") and tc.get("wandb_mode", "online") != "disabled":
            self._wandb = WandbWriter(tc["wandb_project"], self.workdir, conf,
                                      tc.get("wandb_mode", "online"), group=tc.get("wandb_group", ""))

    def write(self, step: int, metrics: dict) -> None:
        if self._file is None:
            return
        row = {"step": int(step), "time": time.time()}
        for k, v in metrics.items():
            v = float(v) if not isinstance(v, (str, bool)) else v
            row[k] = v if not (isinstance(v, float) and not math.isfinite(v)) else str(v)
            if self._tb is not None and isinstance(v, float):
                self._tb.add_scalar(k, v, step)
        self._file.write(json.dumps(row) + "\n")
        if self._wandb is not None:
            self._wandb.write(step, row)
        if self._live:
            shown = " ".join(f"{k}={v:.4g}" for k, v in row.items()
                             if k not in ("step", "time") and isinstance(v, float))
            print(f"step {row['step']}: {shown}", file=sys.stdout, flush=True)
        if self._remote and time.monotonic() - self._last_flush >= self._flush_every_s:
            self.flush()

    def flush(self) -> None:
        """Pushes what was written so far (object stores: rewrites metrics.jsonl and tb events)."""
        if self._file is not None:
            self._file.flush()
        if self._tb is not None:
            self._tb.flush()
        self._last_flush = time.monotonic()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            compact_metrics(self.workdir)
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.close()
        self._file = self._tb = self._wandb = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def metric_series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the rows that logged a finite `key` (non-finite values are strings)."""
    pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), float)]
    return ([s for s, _ in pts], [v for _, v in pts])


def compact_metrics(workdir, upto: int | None = None) -> list[dict]:
    """Rewrites WORKDIR/metrics.jsonl (atomically) with one row per step in ascending order: rows
    of the same step are merged (later values win) and, with `upto`, rows past that step dropped.
    Returns the kept rows. A torn last line (a killed writer) is dropped."""
    path = run_path(workdir) / "metrics.jsonl"
    if not path.exists():
        return []
    by_step: dict[int, dict] = {}
    text = path.read_text()
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        step = int(row.get("step", 0))
        if upto is not None and step > upto:
            continue
        by_step.setdefault(step, {}).update(row)
    rows = [by_step[k] for k in sorted(by_step)]
    new = "".join(json.dumps(r) + "\n" for r in rows)
    if new != text:
        if is_remote(path):
            path.write_text(new)
        else:
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(new)
            os.replace(tmp, path)
    return rows


def clear_tensorboard(workdir) -> None:
    """Deletes the event files under WORKDIR/tb (a resumed run replays the rows it keeps)."""
    tb = run_path(workdir) / "tb"
    if tb.exists():
        for f in tb.iterdir():
            if f.name.startswith("events.out.tfevents"):
                f.unlink()


def replay_rows(tb_writer, rows: list[dict]) -> None:
    """Writes `rows` (their float values, at their steps and wall times) to a tensorboardX
    SummaryWriter."""
    for r in rows:
        for k, v in r.items():
            if k not in ("step", "time") and isinstance(v, float):
                tb_writer.add_scalar(k, v, int(r["step"]), walltime=r.get("time"))


def read_metrics(workdir) -> list[dict]:
    """The rows of WORKDIR/metrics.jsonl (local or URL), [] when there is none."""
    path = run_path(workdir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class StepProfiler:
    """A `jax.profiler` trace of chosen steps (`train.profile_steps`) under WORKDIR/profile/.

    Steps are numbered as in metrics.jsonl (the count of updates done after the step). A run of
    consecutive steps goes into one trace; open it with TensorBoard's profile plugin or xprof
    (`tensorboard --logdir WORKDIR/profile`). A URL workdir gets the trace written locally first and
    copied up when the trace stops. enabled=False (non-lead processes) traces nothing."""

    def __init__(self, workdir, steps=(), enabled: bool = True):
        self.workdir = run_path(workdir)
        self.steps = frozenset(int(s) for s in steps) if enabled else frozenset()
        self._active = None          # the local directory of the trace in progress
        self.traces: list = []       # directories written, for the caller to report

    def start(self, step: int) -> None:
        """Call before running step `step` (1-based, as logged)."""
        if step not in self.steps or self._active is not None:
            return
        import tempfile

        import jax
        target = self.workdir / "profile"
        local = tempfile.mkdtemp(prefix="cj_profile_") if is_remote(self.workdir) else str(target)
        os.makedirs(local, exist_ok=True)
        jax.profiler.start_trace(local)
        self._active = local

    def stop(self, step: int, outputs=None, force: bool = False) -> None:
        """Call after step `step` with its outputs; ends the trace after the last consecutive
        profiled step (or always with force=True)."""
        if self._active is None or (not force and step + 1 in self.steps):
            return
        import jax
        if outputs is not None:
            jax.block_until_ready(outputs)
        jax.profiler.stop_trace()
        local, self._active = self._active, None
        target = self.workdir / "profile"
        if is_remote(self.workdir):
            _copy_tree(pathlib.Path(local), target)
        self.traces.append(target)

    def close(self) -> None:
        self.stop(-1, force=True)


def _copy_tree(src: pathlib.Path, dst) -> None:
    """Copies local directory `src` into `dst` (any epath), file by file."""
    for f in src.rglob("*"):
        if f.is_file():
            out = dst / str(f.relative_to(src))
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(f.read_bytes())
