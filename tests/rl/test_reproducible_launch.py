"""The reproducible schedule through `launch.py` with the real pieces (engine service, weight
store, rl_step, orbax checkpoints): two runs of the same command and seed give identical
metrics.jsonl rows (wall-clock fields aside), consumed logs and final checkpoint arrays; slow
variants: process workers, the Ray backend, and a run SIGKILLed mid-way and resumed."""
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from composer_jax.rl.run_compare import compare_runs

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
SETS = ["rl.steps=3", "rl.job.checkpoint_every=1", "rl.job.eval_every=3", "rl.batch_groups=2",
        "rl.group_size=4", "rl.job.num_rollout_workers=8", "rl.task.num_train_tasks=8",
        "rl.task.num_eval_tasks=4", "rl.max_staleness=1"]


def _cmd(workdir, extra=()):
    cmd = [sys.executable, str(ROOT / "launch.py"), "--experiment=rl_async_parity",
           f"--workdir={workdir}"]
    for s in SETS + list(extra):
        cmd += ["--set", s]
    return cmd


def _launch(workdir, extra=()):
    p = subprocess.run(_cmd(workdir, extra), cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


def test_same_command_same_run(tmp_path):
    _launch(tmp_path / "a")
    _launch(tmp_path / "b")
    assert compare_runs(tmp_path / "a", tmp_path / "b") == []


@pytest.mark.slow
@pytest.mark.parametrize("extra", [("rl.job.worker_mode=process",), ("rl.job.backend=ray",)])
def test_same_run_on_other_workers_and_backends(tmp_path, extra):
    _launch(tmp_path / "a")
    _launch(tmp_path / "b", extra)
    assert compare_runs(tmp_path / "a", tmp_path / "b") == []


@pytest.mark.slow
@pytest.mark.parametrize("extra", [(), ("rl.job.worker_mode=process",)])
def test_sigkill_and_resume_same_run(tmp_path, extra):
    extra = tuple(extra) + ("rl.steps=6",)
    _launch(tmp_path / "whole", extra)
    cut = tmp_path / "cut"
    proc = subprocess.Popen(_cmd(cut, extra), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    ck = cut / "checkpoints"
    while not (ck.exists() and any(p.name.isdigit() and int(p.name) >= 2 for p in ck.iterdir())):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    p = _launch(cut, extra)
    assert "resumed at version" in p.stderr
    # the weight store's byte counts depend on where its delta chain starts (a fresh store
    # after the resume); everything else is the same
    assert compare_runs(tmp_path / "whole", cut, ignore_transport=True) == []
