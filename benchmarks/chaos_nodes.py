"""Node-loss chaos (`chaos_bench.py --ray_nodes N`): the rl_async run on a local multi-node Ray
cluster (`rl.ray_cluster.LocalRayCluster`: a head node, where the driver, trainer and weight
index run, plus N-1 nodes with the `inference` resource, each its own raylet) while a chaos thread
SIGKILLs a random non-driver node (its raylet and every process on it) every `--every` seconds
and starts a replacement node. The services lost with a node are restarted elsewhere
(`rl/backend_ray.py`, `rl/ray_pool.py`); nobody restarts the run.

Reports: node losses (and the services each one held), service restarts by kind, time lost per
loss (from the SIGKILL until the restarted inference actor answered or the dead workers were
replaced, and the trainer's longest version gap across the loss against the median gap), turns
resumed and tokens saved (`chaos_bench.tally`), error rollouts, and `audit_run` (no rollout
lost or trained twice).
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import random
import secrets
import statistics
import sys
import tempfile
import threading
import time

NODE_RESOURCES = {"inference": 1}


def _services_by_node() -> dict[str, list[str]]:
    """{node id: [actor class, ...]} of the live actors (Ray's GCS actor table)."""
    import ray._private.state
    out: dict[str, list[str]] = {}
    for a in ray._private.state.actors().values():
        if a.get("State") == "ALIVE" and a.get("Address"):
            out.setdefault(a["Address"]["NodeID"], []).append(
                a["ActorClassName"].lstrip("_").replace("Actor", ""))
    return out


def node_chaos(cluster, every: float, seed: int, stop: threading.Event, losses: list) -> None:
    """Every `every` seconds: SIGKILL a random live non-head node, then start a replacement."""
    rng = random.Random(seed)
    while not stop.wait(every):
        victims = [n for n in cluster.live_nodes() if n is not cluster.head]
        if not victims:
            continue
        node = rng.choice(victims)
        try:
            held = sorted(_services_by_node().get(cluster.node_id(node) or "", []))
        except Exception as e:  # noqa: BLE001 - the GCS table is best effort
            held = [f"unknown ({type(e).__name__})"]
        t = time.time()
        procs = cluster.kill_node(node)
        losses.append({"at": t, "node": node.name, "processes": procs, "held": held})
        if stop.is_set():
            return
        try:
            new = cluster.add_node(resources=NODE_RESOURCES)
            losses[-1]["replacement"], losses[-1]["replacement_s"] = new.name, time.time() - t
        except Exception as e:  # noqa: BLE001 - reported; the next round tries again
            losses[-1]["replacement"] = f"failed: {e}"[:200]


def watch_versions(workdir: pathlib.Path, stop: threading.Event, times: list) -> None:
    """time.time() at which each trainer version appeared in rollouts/consumed.jsonl."""
    path = workdir / "rollouts" / "consumed.jsonl"
    while not stop.wait(0.2):
        n = len(path.read_text().splitlines()) if path.exists() else 0
        while len(times) < n:
            times.append(time.time())


def per_loss(losses: list, events: list, version_times: list) -> list[dict]:
    """Each loss with its restarts (events until the next loss), recovery seconds and the
    trainer's version gap across it."""
    gaps = [b - a for a, b in zip(version_times, version_times[1:])]
    median = statistics.median(gaps) if gaps else 0.0
    out = []
    for i, loss in enumerate(losses):
        end = losses[i + 1]["at"] if i + 1 < len(losses) else float("inf")
        mine = [e for e in events if loss["at"] <= e["at"] < end]
        back = [e["at"] + e.get("down_s", 0.0) for e in mine]
        after = [t for t in version_times if t > loss["at"]]
        before = [t for t in version_times if t <= loss["at"]]
        gap = (after[0] - before[-1]) if after and before else None
        out.append({**loss, "restarts": sorted(e["kind"] for e in mine),
                    "recovery_s": (max(back) - loss["at"]) if back else 0.0,
                    "version_gap_s": gap, "extra_s": (gap - median) if gap else None})
    return out


def main(a, argv) -> dict:
    token = secrets.token_hex(32)              # Ray reads the auth mode once, at import: set first
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    from chaos_bench import lookup_config, tally
    from composer_jax.rl.audit import audit_run
    from composer_jax.rl.backend import RayBackend
    from composer_jax.rl.driver import run_rl
    from composer_jax.rl.ray_cluster import LocalRayCluster
    from composer_jax.rl.settings import settings_from_config
    from composer_jax.rl.task_program import task_program_spec
    from composer_jax.rl.weights import WeightSyncSettings
    from machine_load import uptime
    import ray
    load0 = uptime()
    cfg = lookup_config(a)
    rl = dataclasses.replace(
        cfg.rl, steps=a.steps, group_size=a.group_size, batch_groups=a.batch_groups,
        resume_mode=a.resume_mode,
        job=dataclasses.replace(cfg.rl.job, num_rollout_workers=a.workers, backend="ray",
                                eval_every=0, checkpoint_every=a.steps,
                                inference_resource="inference"))
    cfg = dataclasses.replace(cfg, rl=rl, seed=a.seed)
    workdir = pathlib.Path(a.workdir or tempfile.mkdtemp(prefix="chaos-nodes-"))
    stop, losses, version_times = threading.Event(), [], []
    t0 = time.monotonic()
    with LocalRayCluster(token=token) as cluster:
        cluster.start_head()
        for _ in range(a.ray_nodes - 1):
            cluster.add_node(resources=NODE_RESOURCES)
        settings = dataclasses.replace(settings_from_config(cfg), progress=False,
                                       ray_address=cluster.address)
        backend = RayBackend(settings)
        store = backend.make_store(WeightSyncSettings(**dataclasses.asdict(cfg.rl.weight_sync)))
        threads = [threading.Thread(target=node_chaos, daemon=True,
                                    args=(cluster, a.every, a.seed, stop, losses)),
                   threading.Thread(target=watch_versions, daemon=True,
                                    args=(workdir, stop, version_times))]
        for th in threads:
            th.start()
        try:
            summary = run_rl(task_program_spec(cfg), workdir, settings, store, backend=backend)
        finally:
            stop.set()
            for th in threads:
                th.join(timeout=120)
            backend.shutdown()
            ray.shutdown()
    wall = time.monotonic() - t0
    audit = audit_run(workdir, a.group_size)
    t = tally(workdir)
    rows = per_loss(losses, summary["service_events"], version_times)
    lines = [
        f"# chaos_bench --ray_nodes: rl_async (lookup family, tiny MoE) on a local {a.ray_nodes}-"
        f"node Ray cluster, a random non-driver node SIGKILLed every {a.every:g}s",
        f"command: PYTHONPATH=$PWD python benchmarks/chaos_bench.py {' '.join(argv)}",
        f"load before: {load0}",
        f"load after:  {uptime()}",
        f"settings: steps={a.steps} workers={a.workers} G={a.group_size} B={a.batch_groups} "
        f"nodes={a.ray_nodes} (head: driver, trainer, weight index; {a.ray_nodes - 1} nodes with "
        f"the inference resource) kill every {a.every:g}s seed={a.seed}; wall {wall:.0f}s",
        f"trainer versions reached: {summary['version']}/{a.steps} (one process, no manual "
        f"restart)",
        f"node losses: {len(losses)} (each replaced by a new node)",
        f"service restarts by kind: {json.dumps(summary['service_restarts'], sort_keys=True)}",
    ]
    for i, r in enumerate(rows):
        extra = f"{r['extra_s']:+.1f}s" if r["extra_s"] is not None else "n/a"
        lines.append(
            f"  loss {i + 1}: {r['node']} at +{r['at'] - rows[0]['at']:.0f}s, {r['processes']} "
            f"processes, held [{', '.join(r['held'])}]; restarted [{', '.join(r['restarts'])}]; "
            f"recovered in {r['recovery_s']:.1f}s; version gap "
            f"{r['version_gap_s'] or 0:.1f}s ({extra} vs the median gap)")
    recov = [r["recovery_s"] for r in rows if r["restarts"]]
    extras = [r["extra_s"] for r in rows if r["extra_s"] is not None]
    lines += [
        f"time lost per loss: recovery mean {statistics.mean(recov) if recov else 0:.1f}s "
        f"(max {max(recov, default=0):.1f}s) over {len(recov)} losses that held services; "
        f"version gap across a loss minus the median gap: mean "
        f"{statistics.mean(extras) if extras else 0:+.1f}s",
        f"rollouts finished: {summary['rollouts_finished']}  trained: "
        f"{summary['rollouts_trained']}  error rollouts: {summary['error_rollouts']}",
        f"turns resumed: {t['turns_resumed']} (in {t['resumed_rollouts']} rollouts), by cause: "
        f"{json.dumps(t['resumed_by'], sort_keys=True)}; restarts from scratch: "
        f"{t['restarts_from_scratch']}; tokens saved by resuming: {t['tokens_saved']}",
    ]
    lines += [f"error rollout {e}" for e in t["errors"]]
    lines += [f"audit: {json.dumps(audit)}",
              "rollouts lost: 0 (every consumed group complete in the log), trained twice: 0 "
              "(audit_run passed)"]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        pathlib.Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(a.out).write_text(text)
        pathlib.Path(a.out).with_suffix(".json").write_text(json.dumps(
            {"losses": rows, "version_times": version_times, "summary": summary,
             "audit": audit, "tally": t}, indent=1, default=str))
    return {"summary": summary, "audit": audit, "tally": t, "losses": rows}


if __name__ == "__main__":
    sys.exit("run it as benchmarks/chaos_bench.py --ray_nodes N")
