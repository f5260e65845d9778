"""Run outputs: `metrics.jsonl` (one JSON object per logged step, with `step` and `time`) and
TensorBoard events under `tb/`, both in the run's workdir."""
from __future__ import annotations

import json
import math
import pathlib
import time


class MetricsWriter:
    """Appends metrics to WORKDIR/metrics.jsonl and WORKDIR/tb (tensorboardX).

    enabled=False (every process but the first of a multi-host run) writes nothing."""

    def __init__(self, workdir, tensorboard: bool = True, enabled: bool = True):
        self.workdir = pathlib.Path(workdir)
        self._file = self._tb = None
        if not enabled:
            return
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._file = open(self.workdir / "metrics.jsonl", "a", buffering=1)
        if tensorboard:
            from tensorboardX import SummaryWriter
            self._tb = SummaryWriter(str(self.workdir / "tb"))

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

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._tb is not None:
            self._tb.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def metric_series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the rows that logged a finite `key` (non-finite values are strings)."""
    pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), float)]
    return ([s for s, _ in pts], [v for _, v in pts])


def read_metrics(workdir) -> list[dict]:
    path = pathlib.Path(workdir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
