"""The Ray backend, short end-to-end: a local Ray cluster started inside the run, the bandit
program's services as Ray actors, weights through Ray's object store (rl.weights RayTransport);
one rollout worker actor is killed mid-run. The run reaches its last version, learns, and the
rollout log shows no rollout lost or trained twice."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("ray")

SCRIPT = r'''
import json, os, signal, sys, threading, time
sys.path.insert(0, {tests!r}); sys.path.insert(0, {root!r})
from composer_jax.rl.backend_ray import init_ray, make_ray_store
from composer_jax.rl.driver import DriverSettings, run_rl
from composer_jax.rl.program import ProgramSpec
from composer_jax.rl.weights import WeightSyncSettings
init_ray("", num_cpus=2)
store = make_ray_store(WeightSyncSettings(dtype=""))
workdir = {workdir!r}
def killer():
    path = os.path.join(workdir, "workers.json")
    while not (os.path.exists(path) and os.path.exists(os.path.join(workdir, "rollouts", "consumed.jsonl"))
               and json.load(open(path))["pids"]):
        time.sleep(0.05)
    pid = json.load(open(path))["pids"][0]
    assert pid > 0, pid
    os.kill(pid, signal.SIGKILL)
threading.Thread(target=killer, daemon=True).start()
s = run_rl(ProgramSpec("rl_fake_program:make", {{"num_tasks": 6, "arms": 3, "env_s": 0.1}}), workdir,
           DriverSettings(steps=6, group_size=2, batch_groups=2, max_staleness=1, num_workers=3,
                          backend="ray", eval_every=3, progress=False), store)
print("SUMMARY " + json.dumps({{k: v for k, v in s.items()}}, default=str))
import ray; ray.shutdown()
'''


def test_ray_backend_end_to_end(tmp_path):
    here = pathlib.Path(__file__).parent
    code = SCRIPT.format(tests=str(here), root=str(here.parent.parent), workdir=str(tmp_path))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240,
                       env=dict(os.environ, RAY_DEDUP_LOGS="0"))
    assert p.returncode == 0, p.stderr[-4000:]
    line = [x for x in p.stdout.splitlines() if x.startswith("SUMMARY ")][-1]
    s = json.loads(line[len("SUMMARY "):])
    assert s["version"] == 6 and s["rollouts_trained"] == 24
    assert s["worker_restarts"] >= 1
    assert s["inference"]["weight_swaps"] >= 2         # versions arrived through Ray's object store
    for version, row in s["eval"].items():   # each held-out row sampled with exactly its version,
        # also when the killed worker was running a held-out episode (it reruns at that version)
        assert row["eval_sampled_version_min"] == row["eval_sampled_version_max"] == int(version)
    assert s["eval"]["0"]["eval_resolved_rate"] == 0.5      # version 0: every logit 0, arm 0
    assert s["eval"]["6"]["eval_resolved_rate"] > s["eval"]["0"]["eval_resolved_rate"]
    from composer_jax.rl.audit import audit_run
    a = audit_run(tmp_path, 2)
    # groups set aside as too stale are consumed (never trained, never re-opened)
    assert a["consumed"] == 24 + 2 * s["stale_dropped_groups"] and a["versions"] == 6
