"""Fault tolerance of the asynchronous RL driver (short CI versions), on the bandit program so that
the orchestration is what is tested: SIGKILL of one rollout worker process, SIGKILL of the whole
run then a rerun. Both must finish with no finished rollout lost or trained twice, checked from the
rollout log, consumed.jsonl and the checkpoint's consumed groups (`rl/audit.py`)."""
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from composer_jax.rl.audit import AuditError, audit_run

HERE = pathlib.Path(__file__).parent
RUN = HERE / "rl_fake_run.py"


def _start(workdir, settings, program):
    return subprocess.Popen([sys.executable, str(RUN), str(workdir), json.dumps(settings),
                             json.dumps(program)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _summary(out: str) -> dict:
    line = [x for x in out.splitlines() if x.startswith("SUMMARY ")]
    assert line, out
    return json.loads(line[-1][len("SUMMARY "):])


def _wait_for(cond, proc, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "timed out waiting for the run"
        time.sleep(0.05)


def _versions(workdir) -> int:
    p = pathlib.Path(workdir) / "rollouts" / "consumed.jsonl"
    return len(p.read_text().splitlines()) if p.exists() else 0


def _checkpoint_groups(workdir):
    from composer_jax.rl.checkpoint import RLCheckpointer
    ck = RLCheckpointer(pathlib.Path(workdir) / "checkpoints")
    import numpy as np
    state, meta = ck.restore_latest({"logits": np.zeros((6, 3), np.float32)})
    ck.close()
    return meta


def test_sigkill_one_rollout_worker(tmp_path):
    settings = {"steps": 6, "group_size": 2, "batch_groups": 2, "max_staleness": 1,
                "num_workers": 2, "worker_mode": "process", "checkpoint_every": 3}
    program = {"num_tasks": 6, "arms": 3, "env_s": 0.15}
    proc = _start(tmp_path, settings, program)
    workers = tmp_path / "workers.json"
    _wait_for(lambda: workers.exists() and len(json.loads(workers.read_text())["pids"]) == 2
              and _versions(tmp_path) >= 1, proc)
    victim = json.loads(workers.read_text())["pids"][0]
    os.kill(victim, signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    s = _summary(out)
    assert s["version"] == 6
    assert s["worker_restarts"] >= 1
    assert "rollout worker died" in err
    assert s["rollouts_trained"] == 6 * 2 * 2
    a = audit_run(tmp_path, 2, _checkpoint_groups(tmp_path)["consumed_groups"])
    dropped = s["stale_dropped_groups"]          # groups set aside as too stale (consumed, untrained)
    assert a["consumed"] == 24 + 2 * dropped and a["consumed_groups"] == 12 + dropped
    assert a["versions"] == 6
    _assert_staleness_bounded(tmp_path, settings["max_staleness"])
    assert victim not in json.loads(workers.read_text())["pids"]


def test_sigkill_whole_run_then_resume(tmp_path):
    settings = {"steps": 10, "group_size": 2, "batch_groups": 2, "max_staleness": 2,
                "num_workers": 3, "worker_mode": "thread", "checkpoint_every": 2}
    program = {"num_tasks": 6, "arms": 3, "env_s": 0.04, "crash_tasks": 1}
    proc = _start(tmp_path, settings, program)
    _wait_for(lambda: _versions(tmp_path) >= 5, proc)
    proc.kill()
    proc.wait()
    before = set((tmp_path / "rollouts").glob("g*/*.rollout"))
    assert 0 < len(before)
    meta1 = _checkpoint_groups(tmp_path)
    assert 0 < meta1["version"] < 10
    proc = _start(tmp_path, settings, program)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    s = _summary(out)
    assert "resumed at version" in err
    assert s["resumed_from"] == meta1["version"] and s["version"] == 10
    # rollouts finished before the kill are reused, not re-run
    assert s["readmitted"] >= 1
    assert before <= set((tmp_path / "rollouts").glob("g*/*.rollout"))
    meta2 = _checkpoint_groups(tmp_path)
    a = audit_run(tmp_path, 2, meta2["consumed_groups"])
    dropped = meta2["dropped_groups"]             # over both lives of the run
    assert a["consumed_groups"] == 20 + dropped and a["consumed"] == 40 + 2 * dropped
    assert a["versions"] == 10
    # staleness is bounded at consumption in every metrics row, before and after the resume
    _assert_staleness_bounded(tmp_path, settings["max_staleness"])
    # crashed episodes became error rollouts (reward 0), not a crashed run
    assert s["error_rollouts"] >= 1


def _assert_staleness_bounded(workdir, bound: int) -> None:
    rows = [json.loads(x) for x in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "staleness_max" in r]
    assert train and all(r["staleness_max"] <= bound for r in train), \
        [r["staleness_max"] for r in train]
    assert all("stale_dropped_groups" in r for r in train)


def test_audit_detects_double_training(tmp_path):
    from composer_jax.rl.stream import RolloutLog
    log = RolloutLog(tmp_path / "rollouts")
    log.append_admitted("g0000000", "t", 0)
    log.append_consumed(1, ["g0000000"], ["g0000000-s000"])
    log.append_consumed(2, ["g0000001"], ["g0000000-s000"])
    with pytest.raises(AuditError, match="trained twice"):
        audit_run(tmp_path, 1)
