"""A short version of the `cpt_debug` experiment: real local code, the real config, and the
validation loss must fall clearly (the full run is marked slow)."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _run(tmp_path, steps):
    """`launch.py --experiment=cpt_debug` for `steps` steps; (val losses, MTP losses) as logged.
    XLA compiles at its default -O2 here: this test's time is in running steps, not compiling."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=2")
    proc = subprocess.run([sys.executable, "launch.py", "--experiment=cpt_debug", f"--workdir={tmp_path}",
                           "--set", f"train.steps={steps}", "--set", f"train.eval_every={steps // 4}",
                           "--set", f"train.checkpoint_every={steps}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    mtp = [r["mtp_loss"] for r in rows if "mtp_loss" in r]
    assert all(isinstance(r["loss"], float) for r in rows), "a logged loss is NaN/Inf"
    return val, mtp


def test_cpt_debug_short_learns(tmp_path):
    val, mtp = _run(tmp_path, steps=120)
    assert val[-1] <= 0.85 * val[0], val
    assert mtp[-1] < mtp[0] - 0.5, mtp


@pytest.mark.slow
def test_cpt_debug_full_meets_acceptance(tmp_path):
    val, mtp = _run(tmp_path, steps=320)
    assert val[-1] <= 0.70 * val[0], val
    assert mtp[-1] < mtp[0], mtp
