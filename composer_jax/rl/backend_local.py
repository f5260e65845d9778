"""The embedded backend (`rl.job.backend=local`): rollout workers as threads or processes on this
machine, the inference service and the trainer in the driver process. No server to start.

- `rl.job.worker_mode=thread`: each worker is a thread that calls the in-process policy server
  directly (episodes spend their time in sandbox subprocesses and the engine, which release the GIL).
- `rl.job.worker_mode=process`: each worker is a spawned Python process that never imports JAX; it runs
  the environment side of the episode and reaches the policy through a pipe, served by one thread of
  the driver per worker. A worker that dies (SIGKILL, OOM) is detected by the broken pipe: its
  running episode goes back to the driver to run again (it had not finished, so nothing is lost)
  and a fresh process replaces it. Episodes of a resumable program send a checkpoint after every
  completed turn (`agent.episode_checkpoint`); the driver's slot thread writes it to the pool's
  `CheckpointStore` before the worker goes on, and a dead worker's episode goes back with its
  newest checkpoint (`Job.resume`), so it continues from its last completed turn.

Both implement the pool interface the driver uses: `submit(job)`, `results(timeout)` ->
[(job, rollout or None if the worker died)], `num_idle()`, `worker_pids()`, `restarts`, `close()`.
"""
from __future__ import annotations

import dataclasses
import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from multiprocessing.connection import Connection

from composer_jax.agent.episode_checkpoint import CheckpointStore, EpisodeCheckpoint
from composer_jax.rl.jobs import Job, run_job
from composer_jax.rl.program import LocalClient, ProgramSpec, build_program
from composer_jax.rl.rollout import Rollout


class _PoolBase:
    def __init__(self, num_workers: int):
        self.num_workers = num_workers
        self._jobs: queue.Queue = queue.Queue()
        self._results: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._busy = 0
        self._lock = threading.Lock()
        self.restarts = 0

    def submit(self, job: Job) -> None:
        with self._lock:
            self._busy += 1
        self._jobs.put(job)

    def _done(self, job: Job, rollout: Rollout | None) -> None:
        with self._lock:
            self._busy -= 1
        self._results.put((job, rollout))

    def num_idle(self) -> int:
        with self._lock:
            return max(0, self.num_workers - self._busy)

    def results(self, timeout: float) -> list[tuple[Job, Rollout | None]]:
        out = []
        try:
            out.append(self._results.get(timeout=timeout))
            while True:
                out.append(self._results.get_nowait())
        except queue.Empty:
            pass
        return out

    def _next_job(self) -> Job | None:
        while not self._stop.is_set():
            try:
                return self._jobs.get(timeout=0.1)
            except queue.Empty:
                continue
        return None


class ThreadPool(_PoolBase):
    """Rollout workers as threads sharing the in-process inference service."""

    def __init__(self, spec: ProgramSpec, inference, num_workers: int):
        super().__init__(num_workers)
        self.program = build_program(spec)
        self.client = LocalClient(inference)
        self._threads = [threading.Thread(target=self._work, args=(i,), daemon=True,
                                          name=f"rollout-{i}") for i in range(num_workers)]
        for t in self._threads:
            t.start()

    def _work(self, i: int) -> None:
        while (job := self._next_job()) is not None:
            self._done(job, run_job(self.program, job, self.client, f"thread-{i}"))

    def worker_pids(self) -> list[int]:
        return []

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)


class _PipeClient:
    """PolicyClient inside a worker process: every call is a round trip over the pipe."""

    def __init__(self, conn):
        self.conn = conn

    def call(self, method: str, *args, **kwargs):
        self.conn.send(("call", method, args, kwargs))
        kind, value = self.conn.recv()
        if kind == "err":
            raise RuntimeError(f"policy call {method} failed in the inference service: {value}")
        return value

    def save(self, rollout_id: str, data: bytes) -> None:
        """Sends an episode checkpoint; returns once the driver has it on disk."""
        self.conn.send(("ckpt", rollout_id, data))
        self.conn.recv()


def process_main(conn, factory: str, kwargs: dict, name: str) -> None:
    """A rollout worker process: builds the program's env side and runs the jobs it is sent."""
    program = build_program(ProgramSpec(factory, kwargs))
    client = _PipeClient(conn)
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg[0] == "stop":
            return
        job = msg[1]
        conn.send(("done", run_job(program, job, client, name, save=client.save).to_bytes()))


class ProcessPool(_PoolBase):
    """Rollout workers as spawned processes (JAX-free), replaced when they die. `checkpoints`:
    the folder of the in-flight episodes' checkpoints (default: a temporary one, deleted at
    `close`); `on_checkpoint(rollout_id, data, pid)`: called after each is stored (tests);
    `resumed`/`tokens_saved`: dead workers' episodes sent back with a checkpoint, and the sampled
    tokens those checkpoints held."""

    def __init__(self, spec: ProgramSpec, inference, num_workers: int, checkpoints=None,
                 on_checkpoint=None):
        super().__init__(num_workers)
        self.spec, self.inference = spec, inference
        self._own_dir = None if checkpoints is not None else tempfile.mkdtemp(prefix="cj-ckpt-")
        self.checkpoints = CheckpointStore(checkpoints or self._own_dir)
        self.on_checkpoint = on_checkpoint
        self.resumed = self.tokens_saved = 0
        self._procs: dict[int, subprocess.Popen] = {}
        self._spawned = 0
        self._threads = [threading.Thread(target=self._slot, args=(i,), daemon=True,
                                          name=f"rollout-slot-{i}") for i in range(num_workers)]
        for t in self._threads:
            t.start()

    def _spawn(self, i: int):
        """`python -m composer_jax.rl.worker_process FD SPEC` over a socket pair (a fresh
        interpreter: nothing of the driver, JAX included, is inherited)."""
        ours, theirs = socket.socketpair()
        self._spawned += 1
        spec = json.dumps({"factory": self.spec.factory, "kwargs": self.spec.kwargs,
                           "name": f"process-{i}.{self._spawned}"})
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        p = subprocess.Popen([sys.executable, "-m", "composer_jax.rl.worker_process",
                              str(theirs.fileno()), spec], pass_fds=(theirs.fileno(),), env=env)
        theirs.close()
        conn = Connection(ours.detach())
        with self._lock:
            self._procs[i] = p
        return p, conn

    def _slot(self, i: int) -> None:
        proc, conn = self._spawn(i)
        while not self._stop.is_set():
            job = self._next_job()
            if job is None:
                break
            if self._serve(conn, job):
                continue
            # the worker died: its episode goes on elsewhere from its newest checkpoint. The death
            # is recorded before the job is handed back, so whoever gets it sees the restart and no
            # longer the dead pid (`Popen.poll` says "running" while this thread reaps it)
            with self._lock:
                self.restarts += 1
                self._procs.pop(i, None)
            self._done(self._requeued(job), None)
            _reap(proc)
            conn.close()
            proc, conn = self._spawn(i)
        try:
            conn.send(("stop",))
        except OSError:
            pass
        _reap(proc, 5)

    def _requeued(self, job: Job) -> Job:
        """The dead worker's job with its newest checkpoint (the old one when it sent none)."""
        data = self.checkpoints.get(job.rollout_id)
        if data is not None and data != job.resume:
            with self._lock:
                self.resumed += 1
                self.tokens_saved += EpisodeCheckpoint.from_bytes(data).generated
        return dataclasses.replace(job, resume=data if data is not None else job.resume,
                                   attempt=job.attempt + 1)

    def _serve(self, conn, job: Job) -> bool:
        """Runs one job on the slot's process; False if the process died on the way."""
        try:
            conn.send(("job", job))
            while True:
                msg = conn.recv()
                if msg[0] == "done":
                    self.checkpoints.drop(job.rollout_id)
                    self._done(job, Rollout.from_bytes(msg[1]))
                    return True
                if msg[0] == "ckpt":
                    self.checkpoints.put(msg[1], msg[2])
                    if self.on_checkpoint is not None:
                        self.on_checkpoint(msg[1], msg[2], self._pid_of_slot())
                    conn.send(("ok",))
                    continue
                _, method, args, kwargs = msg
                try:
                    value = ("ret", self.inference.rpc(method, args, kwargs))
                except Exception as e:  # noqa: BLE001  (the episode decides; it becomes an error)
                    value = ("err", f"{type(e).__name__}: {e}")
                conn.send(value)
        except (EOFError, OSError):
            return False

    def _pid_of_slot(self) -> int:
        """The pid of the calling slot thread's worker."""
        i = int(threading.current_thread().name.rsplit("-", 1)[1])
        with self._lock:
            return self._procs[i].pid

    def worker_pids(self) -> list[int]:
        with self._lock:
            return [p.pid for p in self._procs.values() if p.poll() is None]

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)


def _reap(proc: subprocess.Popen, timeout: float = 1.0) -> None:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
