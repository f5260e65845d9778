"""Chaos run: an asynchronous RL run with process rollout workers while a chaos thread kills a
random rollout worker (SIGKILL) or the engine service (every request in flight fails, every
session is lost, a fresh engine with the same weights takes over) every `--every` seconds.

    PYTHONPATH=$PWD python benchmarks/chaos_bench.py --out benchmarks/results/chaos_bench.txt

Reports: rollouts finished, error rollouts (an interruption that did not resume would be one),
worker deaths and engine restarts, turns resumed (episodes continued from a checkpoint, by a
replacement worker or in place after an engine restart), sampled tokens saved by resuming (the
checkpoints' recorded tokens, which a from-scratch re-run would have sampled again) against the
tokens regenerated (an upper bound: all sampled tokens of the turn in flight at each
interruption, and of turn 1 of episodes that had no checkpoint yet), and the audit of the run
directory (`rl.audit.audit_run`: no rollout trained twice, every consumed group complete in the
log).

Family: the rl_async default (`lookup`: multi-turn read_file/finish episodes, the tiny MoE after
its cached SFT), not `coding`: a coding episode on this 2-core machine takes minutes (19 episodes
in 12 minutes: experiments/rl.py), so a run of a few minutes would see a handful of episodes; the
lookup family has no sandbox, so sandbox kills are not exercised here (a coding workspace is
checkpointed as a diff against the task snapshot: `agent.episode_checkpoint.workspace_state`).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


class RestartableServer:
    """The policy server with an engine that can be killed: `kill_engine()` replaces the engine
    with a fresh one (same weights, version and settings) and fails every request of the old one
    (its waiters get an error, as from a crashed engine service)."""

    def __init__(self, server):
        self.server = server
        self.generation = 0
        self.restarts = 0
        self._lock = threading.Lock()

    @property
    def version(self):
        return self.server.version

    def load_from(self, store, version):
        with self._lock:
            self.server.load_from(store, version)

    def stats(self):
        return {**self.server.stats(), "engine_restarts": self.restarts}

    def close(self):
        self.server.close()

    def rpc(self, method, args, kwargs):
        gen = self.generation
        if method == "submit":
            return gen * 1_000_000_000 + self.server.rpc(method, args, kwargs)
        if method == "wait":
            rid, rest = args[0], args[1:]
            if rid // 1_000_000_000 != gen:
                raise RuntimeError("the engine service restarted; the request is gone")
            out = self.server.rpc(method, (rid % 1_000_000_000,) + tuple(rest), kwargs)
            if self.generation != gen:
                raise RuntimeError("the engine service restarted during the request")
            return out
        return self.server.rpc(method, args, kwargs)

    def kill_engine(self) -> None:
        from composer_jax.inference.engine import Engine
        with self._lock:
            old = self.server.engine
            new = Engine(old.graphdef, old.state, old.cfg, version=old.version)
            new._next_id = old._next_id + 1      # request ids never collide with the old ones
            self.server.engine = new.start()
            self.generation += 1
            self.restarts += 1
        with old._lock:
            live = [rid for rid, c in old.completions.items() if not c.finished]
        futures = []
        for rid in live:
            try:
                futures.append(old.future(rid))
            except KeyError:                 # finished meanwhile
                pass
        for rid in live:
            old.cancel(rid)                  # their waiters return, and rpc raises for them
        for f in futures:
            try:
                f.result(timeout=60)
            except Exception:  # noqa: BLE001  (a cancelled or failed request: either is gone)
                pass
        old.stop(timeout=30)


class ChaosBackend:
    """The local backend (process workers) keeping handles on what it made."""

    def __init__(self, settings):
        from composer_jax.rl.backend import LocalBackend
        self.inner = LocalBackend(settings)
        self.inference = self.pool = None

    def make_store(self, sync):
        return self.inner.make_store(sync)

    def make_inference(self, spec, store):
        inf = self.inner.make_inference(spec, store)
        inf.server = RestartableServer(inf.server)
        self.inference = inf
        return inf

    def make_pool(self, spec, inference):
        self.pool = self.inner.make_pool(spec, inference)
        return self.pool

    def shutdown(self):
        self.inner.shutdown()


def chaos(backend: ChaosBackend, every: float, seed: int, stop: threading.Event, events: list):
    rng = random.Random(seed)
    while not stop.wait(every):
        if backend.pool is None:
            continue
        if rng.random() < 0.5:
            pids = backend.pool.worker_pids()
            if pids:
                pid = rng.choice(pids)
                try:
                    os.kill(pid, signal.SIGKILL)
                    events.append(("worker", time.monotonic(), pid))
                except ProcessLookupError:
                    pass
        else:
            backend.inference.server.kill_engine()
            events.append(("engine", time.monotonic(), 0))


def tally(workdir: pathlib.Path) -> dict:
    """Resumes and tokens from the logged rollouts (module docstring)."""
    from composer_jax.agent.rollout import Rollout
    from composer_jax.rl.stream import RolloutLog
    out = dict(rollouts=0, resumed_rollouts=0, turns_resumed=0, tokens_saved=0,
               tokens_regenerated_max=0, restarts_from_scratch=0, sampled_tokens=0)
    for logged in RolloutLog(workdir / "rollouts").scan():
        r = Rollout.load(logged.path)
        out["rollouts"] += 1
        out["sampled_tokens"] += r.num_trainable
        turns = [t for s in r.segments for t in s.turns]
        at = r.info.get("resumed_at_turns", [])
        out["turns_resumed"] += len(at)
        out["resumed_rollouts"] += bool(at)
        out["tokens_saved"] += sum(r.info.get("resumed_tokens_saved", []))
        for k in at:                       # the turn in flight when it was interrupted
            if k < len(turns):
                out["tokens_regenerated_max"] += turns[k].sample_end - turns[k].sample_start
        scratch = r.info.get("worker_deaths", 0) + r.info.get("interruptions", 0) - len(at)
        if scratch > 0 and turns:
            out["restarts_from_scratch"] += scratch
            out["tokens_regenerated_max"] += scratch * (turns[0].sample_end - turns[0].sample_start)
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--batch-groups", type=int, default=2)
    ap.add_argument("--every", type=float, default=3.0, help="seconds between kills")
    ap.add_argument("--resume-mode", default="prefill", choices=("prefill", "replay"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default="")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    import faulthandler
    faulthandler.register(signal.SIGUSR1)       # kill -USR1 PID: every thread's stack

    from composer_jax import registry
    from composer_jax.rl.audit import audit_run
    from composer_jax.rl.driver import run_rl
    from composer_jax.rl.settings import settings_from_config
    from composer_jax.rl.task_program import task_program_spec
    from composer_jax.rl.weights import WeightSyncSettings
    cfg = registry.get("rl_async").make_config()
    rl = dataclasses.replace(
        cfg.rl, steps=a.steps, group_size=a.group_size, batch_groups=a.batch_groups,
        resume_mode=a.resume_mode, task=dataclasses.replace(cfg.rl.task, num_eval_tasks=8),
        job=dataclasses.replace(cfg.rl.job, num_rollout_workers=a.workers, worker_mode="process",
                                eval_every=0, checkpoint_every=a.steps))
    cfg = dataclasses.replace(cfg, rl=rl, seed=a.seed)
    workdir = pathlib.Path(a.workdir or tempfile.mkdtemp(prefix="chaos-"))
    settings = dataclasses.replace(settings_from_config(cfg), progress=False)
    backend = ChaosBackend(settings)
    store = backend.make_store(WeightSyncSettings(**dataclasses.asdict(cfg.rl.weight_sync)))
    stop, events = threading.Event(), []
    th = threading.Thread(target=chaos, args=(backend, a.every, a.seed, stop, events), daemon=True)
    load0 = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    t0 = time.monotonic()
    th.start()
    try:
        summary = run_rl(task_program_spec(cfg), workdir, settings, store, backend=backend)
    finally:
        stop.set()
        th.join()
        backend.shutdown()
    wall = time.monotonic() - t0
    audit = audit_run(workdir, a.group_size)
    t = tally(workdir)
    kills = {k: sum(e[0] == k for e in events) for k in ("worker", "engine")}
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    lines = [
        "# chaos_bench: RL run (rl_async lookup family, tiny MoE, process rollout workers) with "
        "a random kill every few seconds",
        f"command: PYTHONPATH=$PWD python benchmarks/chaos_bench.py {' '.join(argv or sys.argv[1:])}",
        f"load before: {load0}",
        f"load after:  {load}",
        f"settings: steps={a.steps} workers={a.workers} G={a.group_size} B={a.batch_groups} "
        f"kill every {a.every}s resume_mode={a.resume_mode} seed={a.seed}; wall {wall:.0f}s",
        f"kills: worker SIGKILL {kills['worker']}, engine restart {kills['engine']}, "
        f"sandbox 0 (the lookup family has no sandbox)",
        f"trainer versions reached: {summary['version']}/{a.steps}",
        f"rollouts finished: {summary['rollouts_finished']}  trained: "
        f"{summary['rollouts_trained']}  error rollouts: {summary['error_rollouts']}",
        f"worker restarts (pool): {summary['worker_restarts']}  episodes sent back with a "
        f"checkpoint: {summary['episodes_resumed']}",
        f"turns resumed: {t['turns_resumed']} (in {t['resumed_rollouts']} rollouts); restarts "
        f"from scratch (no checkpoint yet): {t['restarts_from_scratch']}",
        f"sampled tokens: {t['sampled_tokens']}; saved by resuming: {t['tokens_saved']}; "
        f"regenerated (at most): {t['tokens_regenerated_max']} (from scratch, the interrupted "
        f"episodes would have sampled up to {t['tokens_saved'] + t['tokens_regenerated_max']} "
        f"again)",
        f"audit: {json.dumps(audit)}",
        f"lost: 0 (every consumed group complete in the log), trained twice: 0 "
        f"(audit_run passed)",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        pathlib.Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(a.out).write_text(text)
    return {"summary": summary, "audit": audit, "tally": t, "kills": kills}


if __name__ == "__main__":
    main()
