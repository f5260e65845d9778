"""Where the RL services run, chosen in one place: `make_backend(settings)`.

A `Backend` builds the weight store the trainer publishes to, the inference service (the policy
server plus its weight poller) and the rollout worker pool, and cleans up what it started:

    LocalBackend   one machine: in-process store, inference in the driver process, rollout workers
                   as threads or JAX-free processes (`rl/backend_local.py`)
    RayBackend     the same services as Ray actors, weights through Ray's object store
                   (`rl/backend_ray.py`, `rl/ray_pool.py`; address "" starts a local cluster,
                   shut down at the end); services restarted on live nodes when theirs is lost

The trainer always runs in the driver process (one SPMD JAX program).
"""
from __future__ import annotations

from typing import Protocol

from composer_jax.rl.backend_local import ProcessPool, ThreadPool
from composer_jax.rl.backend_ray import RayInference, _ray, init_ray, make_ray_store
from composer_jax.rl.inference_service import InferenceService
from composer_jax.rl.program import ProgramSpec, build_program
from composer_jax.rl.ray_pool import RayPool
from composer_jax.rl.settings import DriverSettings
from composer_jax.rl.weights import MemoryTransport, WeightStore


class Backend(Protocol):
    def make_store(self, sync_settings): ...
    def make_inference(self, spec: ProgramSpec, store): ...
    def make_pool(self, spec: ProgramSpec, inference): ...
    def shutdown(self) -> None: ...


def _started(inference):
    inference.wait_for_weights()
    inference.start()
    return inference


class LocalBackend:
    """rl.job.backend=local (module docstring)."""

    def __init__(self, settings: DriverSettings):
        self.settings = settings

    def make_store(self, sync_settings):
        return WeightStore(MemoryTransport(), sync_settings, reader_name="inference")

    def make_inference(self, spec: ProgramSpec, store):
        return _started(InferenceService(build_program(spec), store, self.settings.weight_poll_s))

    def make_pool(self, spec: ProgramSpec, inference):
        cls = ProcessPool if self.settings.worker_mode == "process" else ThreadPool
        return cls(spec, inference, self.settings.num_workers)

    def shutdown(self) -> None:
        pass


class RayBackend:
    """rl.job.backend=ray (module docstring)."""

    def __init__(self, settings: DriverSettings):
        self.settings = settings
        self.store = None

    def make_store(self, sync_settings):
        init_ray(self.settings.ray_address)
        self.store = make_ray_store(sync_settings)
        return self.store

    def make_inference(self, spec: ProgramSpec, store):
        return _started(RayInference(spec, store, self.settings))

    def make_pool(self, spec: ProgramSpec, inference):
        return RayPool(spec, inference, self.settings.num_workers)

    def shutdown(self) -> None:
        if self.store is not None:
            self.store.transport.close()         # its index keeper thread
        if not self.settings.ray_address:        # the local cluster this run started
            _ray().shutdown()


def make_backend(settings: DriverSettings) -> Backend:
    """The backend `settings.backend` names ("local" or "ray")."""
    return RayBackend(settings) if settings.backend == "ray" else LocalBackend(settings)
