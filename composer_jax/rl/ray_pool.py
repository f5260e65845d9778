"""Rollout workers as Ray actors (`rl.job.backend=ray`), with the local pools' interface
(`rl/backend_local.py`): submit, num_idle, results, worker_pids, close.

Each worker is an actor (`num_cpus=0`, no JAX unless the program's env side needs it) that runs
one episode at a time and reaches the policy through the inference actor
(`backend_ray.RayPolicyClient`). A worker that dies (its process killed, its node lost) surfaces
as a Ray error on its episode: the driver starts a new actor in its slot (anywhere in the
cluster) and the episode goes back with its newest turn checkpoint (`Job.resume`). Held-out
evaluation episodes run on the same workers, so a lost evaluator episode is re-run the same way.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time

from composer_jax.agent.episode_checkpoint import CheckpointStore, EpisodeCheckpoint
from composer_jax.rl.backend_ray import RayPolicyClient, _ray
from composer_jax.rl.jobs import EVAL, Job, run_job
from composer_jax.rl.program import ProgramSpec, build_program
from composer_jax.rl.rollout import Rollout


class _WorkerActor:
    def __init__(self, factory: str, kwargs: dict, inference_actor, name: str):
        self.program = build_program(ProgramSpec(factory, kwargs))
        self.client = RayPolicyClient(inference_actor)
        self.name = name

    def pid(self) -> int:
        return os.getpid()

    def run(self, job: Job, checkpoints: str = "") -> bytes:
        """One job; turn checkpoints go to the `CheckpointStore` folder `checkpoints` (a folder
        every worker and the driver see: one machine, or a shared file system)."""
        save = CheckpointStore(checkpoints).put if checkpoints else None
        return run_job(self.program, job, self.client, self.name, save=save).to_bytes()


class RayPool:
    """Rollout worker actors (module docstring). A dead actor's episode goes back with its newest
    turn checkpoint from `checkpoints` (default: a temporary folder, so one machine; give a
    shared folder for a multi-host cluster). `restarts` counts replaced workers, `events` holds
    (time.time(), "rollout_worker" | "eval_worker") of each replacement."""

    def __init__(self, spec: ProgramSpec, inference, num_workers: int, checkpoints: str = ""):
        ray = self._ray = _ray()
        self._own_dir = "" if checkpoints else tempfile.mkdtemp(prefix="cj-ckpt-")
        self.checkpoints = CheckpointStore(checkpoints or self._own_dir)
        self.resumed = self.tokens_saved = self.restarts = 0
        self.events: list[tuple[float, str]] = []
        self.spec, self.inference, self.num_workers = spec, inference, num_workers
        self._cls = ray.remote(num_cpus=0)(_WorkerActor)
        self._actors: list = [None] * num_workers
        self._pid_refs: list = [None] * num_workers
        self._pids: list[int] = [0] * num_workers
        self._spawned = 0
        for i in range(num_workers):
            self._new_actor(i)
        self._queue: list[Job] = []
        self._inflight: dict = {}          # ObjectRef -> (slot, job)

    def _new_actor(self, i: int) -> None:
        """A fresh actor in slot `i`; its pid is read when it is up (never blocks the driver)."""
        self._spawned += 1
        self._actors[i] = self._cls.remote(self.spec.factory, self.spec.kwargs,
                                           self.inference.actor, f"ray-{i}.{self._spawned}")
        self._pid_refs[i] = self._actors[i].pid.remote()
        self._pids[i] = 0

    def submit(self, job: Job) -> None:
        self._queue.append(job)

    def num_idle(self) -> int:
        return max(0, self.num_workers - len(self._inflight) - len(self._queue))

    def _dispatch(self) -> None:
        busy = {slot for slot, _ in self._inflight.values()}
        for i in range(self.num_workers):
            if not self._queue:
                return
            if i not in busy:
                job = self._queue.pop(0)
                self._inflight[self._actors[i].run.remote(
                    job, str(self.checkpoints.root))] = (i, job)

    def results(self, timeout: float) -> list[tuple[Job, Rollout | None]]:
        """Finished episodes; (job with its newest checkpoint, None) for each whose worker died
        (any Ray error on the result: the actor, its node or the result's object was lost)."""
        from ray.exceptions import RayError
        self._dispatch()
        if not self._inflight:
            time.sleep(timeout)
            return []
        ready, _ = self._ray.wait(list(self._inflight), num_returns=len(self._inflight),
                                  timeout=timeout)
        out = []
        for ref in ready:
            slot, job = self._inflight.pop(ref)
            try:
                out.append((job, Rollout.from_bytes(self._ray.get(ref))))
                self.checkpoints.drop(job.rollout_id)
            except RayError:
                out.append((self._requeued(job), None))
                self.restarts += 1
                self.events.append((time.time(), "eval_worker" if job.kind == EVAL
                                    else "rollout_worker"))
                self._new_actor(slot)
        self._dispatch()
        return out

    def _requeued(self, job: Job) -> Job:
        """The dead actor's job with its newest checkpoint (the old one when it sent none)."""
        data = self.checkpoints.get(job.rollout_id)
        if data is not None and data != job.resume:
            self.resumed += 1
            self.tokens_saved += EpisodeCheckpoint.from_bytes(data).generated
        return dataclasses.replace(job, resume=data if data is not None else job.resume,
                                   attempt=job.attempt + 1)

    def worker_pids(self) -> list[int]:
        """The pids of the workers that are up (a new worker's once it answered)."""
        for i, ref in enumerate(self._pid_refs):
            if ref is not None and self._ray.wait([ref], timeout=0)[0]:
                try:
                    self._pids[i] = self._ray.get(ref)
                except Exception:  # noqa: BLE001 - died before it answered: replaced later
                    self._pids[i] = 0
                self._pid_refs[i] = None
        return [pid for pid in self._pids if pid > 0]

    def close(self) -> None:
        for a in self._actors:
            try:
                self._ray.kill(a)
            except Exception:  # noqa: BLE001  (already dead)
                pass
        if self._own_dir:
            shutil.rmtree(self._own_dir, ignore_errors=True)
