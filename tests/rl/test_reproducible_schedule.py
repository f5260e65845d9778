"""The reproducible schedule (`rl/schedule.py`, rl.schedule=reproducible): the version each group
is sampled with is fixed by its index, the trainer consumes groups in index order, so two runs
with the same seed are the same run although episodes finish in a different order every time
(random environment latencies, 6 concurrent workers), and a run killed with SIGKILL and resumed
is the same run too. On the bandit program (no JAX model: fast)."""
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from composer_jax.rl.driver import DriverSettings, run_rl  # noqa: E402
from composer_jax.rl.program import ProgramSpec  # noqa: E402
from composer_jax.rl.rollout import Rollout  # noqa: E402
from composer_jax.rl.run_compare import compare_runs  # noqa: E402
from composer_jax.rl.schedule import VersionSchedule  # noqa: E402
from rl_fake_program import MemoryStore  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
SETTINGS = dict(steps=8, group_size=4, batch_groups=2, max_staleness=2, num_workers=6,
                checkpoint_every=2, eval_every=4, schedule="reproducible")
PROGRAM = {"num_tasks": 6, "arms": 3, "latency_scale": 0.02, "num_eval": 3}


def test_version_schedule_assigns_each_group_one_version():
    vs = VersionSchedule(batch_groups=3, lag=2)
    assert [vs.sampling_version(i) for i in range(0, 18, 3)] == [0, 0, 0, 1, 2, 3]
    seen = []
    for v in range(6):
        idx = list(vs.groups_of_version(v))
        assert all(vs.sampling_version(i) == v for i in idx)
        seen += idx
    assert seen == list(range(len(seen))) and len(seen) == 24
    assert vs.step_groups(4) == ["g0000012", "g0000013", "g0000014"]
    # the trainer's step from v takes groups sampled with max(0, v - S): staleness min(v, S)
    for v in range(8):
        assert {vs.sampling_version(int(g[1:])) for g in vs.step_groups(v)} == {max(0, v - 2)}


def _run(workdir, settings=SETTINGS):
    return run_rl(ProgramSpec("rl_fake_program:make", PROGRAM), workdir,
                  DriverSettings(progress=False, **settings), MemoryStore())


def _versions(workdir) -> dict[str, set]:
    """group id -> the versions that sampled its tokens (from the rollout log)."""
    out = {}
    for f in (pathlib.Path(workdir) / "rollouts").glob("g*/*.rollout"):
        r = Rollout.load(f)
        out.setdefault(r.group_id, set()).update(int(v) for s in r.segments for v in s.versions
                                                 if v >= 0)
    return out


def test_same_seed_same_run_and_versions_follow_the_schedule(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    sa, sb = _run(a), _run(b)
    assert sa["version"] == sb["version"] == 8
    assert compare_runs(a, b) == []
    vs = VersionSchedule(2, 2)
    got = _versions(a)
    assert len(got) == 16
    for gid, versions in got.items():
        assert versions == {vs.sampling_version(int(gid[1:]))}, gid
    rows = [json.loads(x) for x in (a / "rollouts" / "consumed.jsonl").read_text().splitlines()]
    assert [r["groups"] for r in rows] == [vs.step_groups(v) for v in range(8)]
    hist = {int(k): v for k, v in sa["staleness_hist"].items()}
    assert hist == {0: 8, 1: 8, 2: 6 * 8}      # steps 0 and 1 sample version 0, then lag S = 2
    assert sa["eval"]["8"]["eval_resolved_rate"] == sb["eval"]["8"]["eval_resolved_rate"]


def test_free_running_is_still_available(tmp_path):
    s = _run(tmp_path, {**SETTINGS, "schedule": "free_running"})
    assert s["version"] == 8 and not (tmp_path / "policy_versions").exists()


def test_sigkill_and_resume_is_the_same_run(tmp_path):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    _run(whole)
    settings = {**SETTINGS, "steps": 8}
    cmd = [sys.executable, str(HERE / "rl_fake_run.py"), str(cut), json.dumps(settings),
           json.dumps(PROGRAM)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent.parent), str(HERE)])}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    ck = cut / "checkpoints"
    while not (ck.exists() and any(p.name.isdigit() and int(p.name) >= 2 for p in ck.iterdir())):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.15)                      # mid-way between checkpoints, episodes in flight
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (cut / "rl_summary.json").exists()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "resumed at version" in p.stderr
    assert compare_runs(whole, cut) == []
    # the archive keeps only what a resume from the newest checkpoint could need
    kept = sorted(int(x.stem) for x in (cut / "policy_versions").glob("*.pkl"))
    assert kept and min(kept) >= 8 - 2
