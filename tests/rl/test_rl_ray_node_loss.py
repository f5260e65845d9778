"""Node loss on a local two-node Ray cluster (`rl.ray_cluster.LocalRayCluster`: each node its
own raylet, token authentication on): the inference actor runs on the second node (the only one
with the `inference` resource); at version 2 that node is SIGKILLed (raylet and every process)
and a replacement node joins. Ray restarts the inference actor there, it loads the newest
version, and the run reaches its last version with no rollout lost or trained twice. The
cluster is stopped (every process it started) even when the run fails or times out."""
import json
import os
import pathlib
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("ray")

from composer_jax.rl.audit import audit_run  # noqa: E402
from composer_jax.rl.ray_cluster import LocalRayCluster  # noqa: E402

STEPS = 8
DRIVER = r'''
import json, sys
sys.path.insert(0, {tests!r}); sys.path.insert(0, {root!r})
from composer_jax.rl.backend_ray import init_ray, make_ray_store
from composer_jax.rl.driver import DriverSettings, run_rl
from composer_jax.rl.program import ProgramSpec
from composer_jax.rl.weights import WeightSyncSettings
init_ray({address!r})
store = make_ray_store(WeightSyncSettings(dtype=""))
s = run_rl(ProgramSpec("rl_fake_program:make", {{"num_tasks": 6, "arms": 3, "env_s": 0.2}}),
           {workdir!r}, DriverSettings(steps={steps}, group_size=2, batch_groups=2,
           max_staleness=1, num_workers=3, backend="ray", ray_address={address!r},
           inference_resource="inference", progress=False), store)
print("SUMMARY " + json.dumps(s, default=str))
'''


def _version(workdir: pathlib.Path) -> int:
    path = workdir / "rollouts" / "consumed.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _kill_at_version(cluster, node, workdir, version, done: threading.Event, out: dict):
    """Kills `node` once the run reached `version`, then adds a replacement inference node."""
    while not done.is_set() and _version(workdir) < version:
        time.sleep(0.1)
    if done.is_set():
        return
    out["killed"] = cluster.kill_node(node)
    out["at_version"] = _version(workdir)
    out["replacement"] = cluster.add_node(resources={"inference": 1})


def test_killing_the_inference_node_does_not_end_the_run(tmp_path):
    here = pathlib.Path(__file__).parent
    workdir = tmp_path / "run"
    with LocalRayCluster() as cluster:
        cluster.start_head()
        node = cluster.add_node(resources={"inference": 1})
        code = DRIVER.format(tests=str(here), root=str(here.parent.parent), workdir=str(workdir),
                             address=cluster.address, steps=STEPS)
        done, out = threading.Event(), {}
        killer = threading.Thread(target=_kill_at_version,
                                  args=(cluster, node, workdir, 2, done, out), daemon=True)
        killer.start()
        try:
            p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               timeout=240, env=dict(os.environ, RAY_DEDUP_LOGS="0",
                                                     **cluster.token_env))
        finally:
            done.set()
            killer.join(timeout=150)
    assert out.get("killed", 0) >= 2, f"the inference node was not killed: {out}"
    assert p.returncode == 0, p.stderr[-4000:]
    line = [x for x in p.stdout.splitlines() if x.startswith("SUMMARY ")][-1]
    s = json.loads(line[len("SUMMARY "):])
    assert s["finished"] and s["version"] == STEPS
    assert out["at_version"] < STEPS
    assert s["service_restarts"]["inference"] >= 1, s["service_restarts"]
    assert s["inference"]["actor_restarts"] >= 1
    a = audit_run(workdir, 2)                     # nothing lost, nothing trained twice
    assert a["versions"] == STEPS
