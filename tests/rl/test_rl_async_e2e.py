"""`launch.py --experiment=rl_async` end to end with the real pieces (engine service, weight store,
rl_step) on the parity tasks: a short run is SIGKILLed after its first checkpoint and rerun; the
rerun resumes, finishes, writes every output, and the rollout log shows no rollout lost or trained
twice. Slow (model compilation twice): `pytest -m slow tests/rl/test_rl_async_e2e.py`."""
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
SETS = ["rl.steps=6", "rl.job.checkpoint_every=2", "rl.job.eval_every=3",
        "rl.batch_groups=2", "rl.group_size=4", "rl.job.num_rollout_workers=8",
        "rl.task.num_train_tasks=8", "rl.task.num_eval_tasks=4"]


def _cmd(workdir, extra=()):
    cmd = [sys.executable, str(ROOT / "launch.py"), "--experiment=rl_async_parity", f"--workdir={workdir}"]
    for s in SETS + list(extra):
        cmd += ["--set", s]
    return cmd


@pytest.mark.slow
@pytest.mark.parametrize("extra", [(), ("rl.job.worker_mode=process",)])
def test_rl_async_kill_and_resume(tmp_path, extra):
    proc = subprocess.Popen(_cmd(tmp_path, extra), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    ck = tmp_path / "checkpoints"
    while not (ck.exists() and any(p.name.isdigit() for p in ck.iterdir())):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.2)
    proc.kill()
    proc.wait()
    p = subprocess.run(_cmd(tmp_path, extra), cwd=ROOT, capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "resumed at version" in p.stderr
    summary = json.loads((tmp_path / "rl_summary.json").read_text())
    assert summary["version"] == 6 and summary["resumed_from"] >= 2
    from composer_jax.rl.audit import audit_run
    a = audit_run(tmp_path, 4)
    dropped = summary["stale_dropped_groups"]        # consumed as too stale, never trained
    assert a["versions"] == 6 and a["consumed"] == (6 * 2 + dropped) * 4
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    keys = set().union(*rows)
    for k in ("reward_mean", "resolved_rate", "eval_resolved_rate", "staleness_mean",
              "staleness_max", "weight_sync_bytes", "weight_sync_ratio", "rollouts_per_sec",
              "trainer_idle_frac", "loss", "is_weight_mean", "mismatch_abs"):
        assert k in keys, k
    for f in ("config.json", "plots/reward.png", "plots/staleness.png", "plots/throughput.png"):
        assert (tmp_path / f).exists(), f
    assert list((tmp_path / "tb").iterdir())
