"""The Ray backend (`rl.job.backend=ray`): the same services as Ray actors.

- `init_ray(address)`: "" starts a local Ray cluster inside the run (CI, a laptop); an address
  (`rl.job.ray_address=HOST:PORT` or "auto") joins an existing cluster. Workers find this code through
  PYTHONPATH (set from the driver's sys.path for a local cluster; on a real cluster install the
  package on every node: `pip install -e .`).
- Weights travel through Ray's object store (`rl.weights.ray_transport.RayTransport`): the trainer
  (in the driver process: it is one SPMD JAX program, multi-host through `jax.distributed`, not a
  Ray actor) publishes; the inference actor reads with its own reader and swaps in flight.
- `RayInference`: the inference service (`services.InferenceService`) inside one threaded actor
  (`max_concurrency` = rollout workers + 4), so many episodes share one engine.
- `RayPool`: rollout workers as actors (`num_cpus=0`, no JAX unless the program's env side needs
  it); each runs one episode at a time and reaches the policy through the inference actor. A worker
  that dies (its process killed, its node lost) surfaces as `RayActorError`: its episode goes back
  to the driver to run again and a new actor takes its slot.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import tempfile
import uuid

from composer_jax.agent.episode_checkpoint import CheckpointStore, EpisodeCheckpoint
from composer_jax.rl.program import ProgramSpec, build_program
from composer_jax.rl.rollout import Rollout
from composer_jax.rl.inference_service import InferenceService
from composer_jax.rl.jobs import Job, run_job

NAMESPACE = "composer_jax"
_ENV_VARS = ("JAX_PLATFORMS", "XLA_FLAGS", "COMPOSER_JAX_CACHE", "JAX_DEFAULT_MATMUL_PRECISION")


def _ray():
    try:
        import ray
    except ImportError as e:
        from composer_jax.errors import ConfigError
        raise ConfigError("rl.job.backend=ray needs the `ray` package (pinned in requirements.txt: "
                          "pip install -r requirements.txt)") from e
    return ray


def init_ray(address: str = "", num_cpus: int | None = None) -> None:
    """Starts a local cluster (address "") or joins `address`; no-op when Ray is initialised."""
    ray = _ray()
    if ray.is_initialized():
        return
    env = {k: os.environ[k] for k in _ENV_VARS if k in os.environ}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
    kw = dict(namespace=NAMESPACE, runtime_env={"env_vars": env}, log_to_driver=True)
    if address:
        ray.init(address=address, **kw)
    else:
        ray.init(num_cpus=num_cpus or max(2, os.cpu_count() or 2), include_dashboard=False, **kw)


@dataclasses.dataclass(frozen=True)
class RayStoreHandle:
    """A picklable description of the run's weight store on Ray's object store."""
    name: str
    settings: object          # rl.weights.WeightSyncSettings

    def open(self, reader_name: str | None = None):
        from composer_jax.rl.weights import WeightStore
        from composer_jax.rl.weights.ray_transport import RayTransport
        store = WeightStore(RayTransport(self.name, NAMESPACE), self.settings,
                            reader_name=reader_name)
        store.ray_handle = self
        return store


def make_ray_store(settings):
    """The trainer-side store of a new run (Ray must be initialised)."""
    return RayStoreHandle(f"composer_jax_weights_{uuid.uuid4().hex[:12]}", settings).open()


class _InferenceActor:
    def __init__(self, factory: str, kwargs: dict, handle: RayStoreHandle, poll_s: float):
        program = build_program(ProgramSpec(factory, kwargs))
        self.svc = InferenceService(program, handle.open("inference"), poll_s)

    def wait_for_weights(self) -> int:
        return self.svc.wait_for_weights()

    def start(self) -> None:
        self.svc.start()

    def rpc(self, method, args, kwargs):
        return self.svc.rpc(method, args, kwargs)

    def stats(self) -> dict:
        return self.svc.stats()

    def version(self) -> int:
        return self.svc.version()

    def pin(self, version: int) -> None:
        self.svc.pin(version)

    def stop(self) -> None:
        self.svc.stop()


class RayInference:
    """Driver-side handle of the inference actor, with InferenceService's interface."""

    def __init__(self, spec: ProgramSpec, store, settings):
        ray = self._ray = _ray()
        handle = getattr(store, "ray_handle", None)
        if handle is None:
            from composer_jax.errors import ConfigError
            raise ConfigError("rl.job.backend=ray needs the weight store on Ray's object store "
                              "(backend_ray.make_ray_store)")
        actor = ray.remote(num_cpus=0, max_concurrency=settings.num_workers + 4)(_InferenceActor)
        self.actor = actor.remote(spec.factory, spec.kwargs, handle, settings.weight_poll_s)

    def wait_for_weights(self) -> int:
        return self._ray.get(self.actor.wait_for_weights.remote())

    def start(self) -> None:
        self._ray.get(self.actor.start.remote())

    def rpc(self, method, args, kwargs):
        return self._ray.get(self.actor.rpc.remote(method, args, kwargs))

    def version(self) -> int:
        return self._ray.get(self.actor.version.remote())

    def pin(self, version: int) -> None:
        """Serve exactly `version` (rl/schedule.py)."""
        self._ray.get(self.actor.pin.remote(version))

    def stats(self) -> dict:
        try:
            return self._ray.get(self.actor.stats.remote(), timeout=30)
        except Exception as e:  # noqa: BLE001  (stats after a failure must not hide the failure)
            return {"error": repr(e)}

    def stop(self) -> None:
        try:
            self._ray.get(self.actor.stop.remote(), timeout=60)
        finally:
            self._ray.kill(self.actor)


class _RayClient:
    """PolicyClient inside a rollout worker actor: calls the inference actor."""

    def __init__(self, actor):
        import ray
        self._ray, self.actor = ray, actor

    def call(self, method: str, *args, **kwargs):
        return self._ray.get(self.actor.rpc.remote(method, args, kwargs))


class _WorkerActor:
    def __init__(self, factory: str, kwargs: dict, inference_actor, name: str):
        self.program = build_program(ProgramSpec(factory, kwargs))
        self.client = _RayClient(inference_actor)
        self.name = name

    def pid(self) -> int:
        return os.getpid()

    def run(self, job: Job, checkpoints: str = "") -> bytes:
        """One job; turn checkpoints go to the `CheckpointStore` folder `checkpoints` (a folder
        every worker and the driver see: one machine, or a shared file system)."""
        save = CheckpointStore(checkpoints).put if checkpoints else None
        return run_job(self.program, job, self.client, self.name, save=save).to_bytes()


class RayPool:
    """Rollout worker actors with the local pools' interface (see backend_local). A dead actor's
    episode goes back with its newest turn checkpoint (`Job.resume`) from `checkpoints` (default:
    a temporary folder, so one machine; give a shared folder for a multi-host cluster)."""

    def __init__(self, spec: ProgramSpec, inference: RayInference, num_workers: int,
                 checkpoints: str = ""):
        ray = self._ray = _ray()
        self._own_dir = "" if checkpoints else tempfile.mkdtemp(prefix="cj-ckpt-")
        self.checkpoints = CheckpointStore(checkpoints or self._own_dir)
        self.resumed = self.tokens_saved = 0
        self.spec, self.inference, self.num_workers = spec, inference, num_workers
        self._cls = ray.remote(num_cpus=0)(_WorkerActor)
        self._actors: list = [None] * num_workers
        self._pids: list[int] = [0] * num_workers
        self._spawned = 0
        for i in range(num_workers):
            self._new_actor(i)
        self._queue: list[Job] = []
        self._inflight: dict = {}          # ObjectRef -> (slot, job)
        self.restarts = 0

    def _new_actor(self, i: int) -> None:
        self._spawned += 1
        self._actors[i] = self._cls.remote(self.spec.factory, self.spec.kwargs,
                                           self.inference.actor, f"ray-{i}.{self._spawned}")
        self._pids[i] = self._ray.get(self._actors[i].pid.remote())

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
        from ray.exceptions import RayActorError
        self._dispatch()
        if not self._inflight:
            import time
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
            except RayActorError:
                out.append((self._requeued(job), None))
                self.restarts += 1
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
        return list(self._pids)

    def close(self) -> None:
        for a in self._actors:
            try:
                self._ray.kill(a)
            except Exception:  # noqa: BLE001  (already dead)
                pass
        if self._own_dir:
            shutil.rmtree(self._own_dir, ignore_errors=True)
