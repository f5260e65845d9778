"""`launch.py --sweep`: the grid from the command line or a Python file, one trial per point in its
own workdir, finished trials not rerun, the comparison table; the Ray Tune backend (slow)."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from composer_jax.errors import ConfigError
from composer_jax.sweep.grid import parse_grid, point_name

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHORT = ["--config.train.steps=3", "--config.train.warmup_steps=1", "--config.train.eval_every=3",
         "--config.train.checkpoint_every=3", "--config.train.log_every=1",
         "--config.train.eval_batches=1"]


def test_grid_from_flags_and_from_a_file(tmp_path):
    g = parse_grid(["train.lr=1e-3,3e-3", "seed=0,1"])
    assert [point_name(p) for p in g.points()] == ["lr=1e-3,seed=0", "lr=1e-3,seed=1",
                                                    "lr=3e-3,seed=0", "lr=3e-3,seed=1"]
    f = tmp_path / "grid.py"
    f.write_text('SWEEP = {"data.source_roots": [("a", "b"), ()], "model": ["tiny"]}\n'
                 'METRICS = ["val_loss"]\n')
    g = parse_grid([str(f)])
    assert g.points() == [(("data.source_roots", "a,b"), ("model", "tiny")),
                          (("data.source_roots", ""), ("model", "tiny"))]
    assert g.metrics == ("val_loss",)
    for bad, why in [(["seed"], "expected KEY=V1,V2"), (["seed=0,0"], "repeats a value"),
                     (["seed=0", "seed=1"], "names a key twice"), ([str(tmp_path / "no.py")],
                                                                 "no such file")]:
        with pytest.raises(ConfigError, match=why):
            parse_grid(bad)


def _sweep(workdir, *extra):
    return subprocess.run([sys.executable, "launch.py", "--experiment=cpt_debug",
                           f"--workdir={workdir}", "--sweep=train.lr=1e-3,3e-3", *SHORT, *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})


def test_a_bad_point_is_refused_before_any_trial(tmp_path):
    r = _sweep(tmp_path / "s", "--sweep=train.schedule=cosine,sometimes")
    assert r.returncode == 2 and "'sometimes' is not a valid Schedule" in r.stderr
    assert not (tmp_path / "s").exists()


def test_a_sweep_runs_each_point_once_and_tabulates(tmp_path):
    r = _sweep(tmp_path / "s")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    table = json.loads((tmp_path / "s" / "sweep.json").read_text())
    assert [t["trial"] for t in table["trials"]] == ["lr=1e-3", "lr=3e-3"]
    assert all(t["status"] == "done" and "val_loss" in t["metrics"] for t in table["trials"])
    assert (tmp_path / "s" / "sweep.png").exists() and "| lr=3e-3 | 3e-3 | done |" in r.stdout
    trial = json.loads((tmp_path / "s" / "lr=3e-3" / "config.json").read_text())
    assert trial["train"]["lr"] == 3e-3 and trial["train"]["steps"] == 3
    stamp = {p: p.stat().st_mtime_ns for p in (tmp_path / "s").rglob("*") if p.is_file()}
    again = _sweep(tmp_path / "s")
    assert again.returncode == 0 and "2 finished earlier (not rerun), 0 to run" in again.stdout
    assert stamp == {p: p.stat().st_mtime_ns for p in (tmp_path / "s").rglob("*") if p.is_file()}


@pytest.mark.slow
def test_a_sweep_on_a_local_ray_cluster(tmp_path):
    r = _sweep(tmp_path / "s", "--sweep=seed=0,1", "--sweep_backend=ray")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    table = json.loads((tmp_path / "s" / "sweep.json").read_text())
    assert len(table["trials"]) == 4 and all(t["status"] == "done" for t in table["trials"])
    assert (tmp_path / "s" / "ray_tune").is_dir()
