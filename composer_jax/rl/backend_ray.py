"""The Ray backend (`rl.job.backend=ray`): the same services as Ray actors, built to outlive
their nodes (docs/rl_cluster.md, "What survives what").

- `init_ray(address)`: "" starts a local Ray cluster inside the run (CI, a laptop); an address
  (`rl.job.ray_address=HOST:PORT` or "auto") joins an existing cluster. Workers find this code through
  PYTHONPATH (set from the driver's sys.path; on a real cluster install the package on every
  node: `pip install -e .`). Ray 2.60 token authentication: RAY_AUTH_MODE (and RAY_AUTH_TOKEN /
  RAY_AUTH_TOKEN_PATH) are passed on to the actors like the JAX variables.
- Weights travel through Ray's object store (`rl.weights.ray_transport.RayTransport`,
  `mirror=True`): the trainer (in the driver process: it is one SPMD JAX program, multi-host
  through `jax.distributed`, not a Ray actor) publishes and owns the chunks and a copy of the
  index, so a restarted index actor is refilled from it; the inference actor reads with its own
  reader and swaps in flight.
- `RayInference`: the inference service (`services.InferenceService`) inside one threaded actor
  (`max_concurrency` = rollout workers + 4), so many episodes share one engine. Ray restarts it
  on a live node when its node dies (`max_restarts=-1`; with `rl.job.inference_resource=NAME`
  only on nodes started with `--resources='{"NAME": 1}'`); the new actor loads the newest
  published version before it answers. Episodes whose policy calls failed wait until it is back
  and resume from their last turn checkpoint (`jobs.run_job`).
- Rollout workers: `rl/ray_pool.py` (the driver replaces a dead worker and re-runs its episode
  from its checkpoint).
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
import uuid

from composer_jax.errors import ConfigError
from composer_jax.rl.inference_service import InferenceService
from composer_jax.rl.program import ProgramSpec, build_program
from composer_jax.rl.weights import WeightStore
from composer_jax.rl.weights.ray_transport import RayTransport

NAMESPACE = "composer_jax"
_ENV_VARS = ("JAX_PLATFORMS", "XLA_FLAGS", "COMPOSER_JAX_CACHE", "JAX_DEFAULT_MATMUL_PRECISION",
             "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
BACK_TIMEOUT_S = 900.0         # how long a policy call waits for a restarting inference actor


def _ray():
    try:
        import ray
    except ImportError as e:
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

    def open(self, reader_name: str | None = None, mirror: bool = False):
        """A store over the named index; `mirror=True` only in the publishing process (it owns
        the chunks and keeps the copy a restarted index is refilled from)."""
        store = WeightStore(RayTransport(self.name, NAMESPACE, mirror=mirror), self.settings,
                            reader_name=reader_name)
        store.ray_handle = self
        return store


def make_ray_store(settings):
    """The trainer-side store of a new run (Ray must be initialised)."""
    return RayStoreHandle(f"composer_jax_weights_{uuid.uuid4().hex[:12]}", settings).open(
        mirror=True)


class _InferenceActor:
    """Builds the policy server, loads the newest published version and starts the poller: on
    its first start and on every restart after its node died."""

    def __init__(self, factory: str, kwargs: dict, handle: RayStoreHandle, poll_s: float):
        program = build_program(ProgramSpec(factory, kwargs))
        self.svc = InferenceService(program, handle.open("inference"), poll_s)
        self.svc.wait_for_weights()
        self.svc.start()
        self.incarnation = uuid.uuid4().hex

    def wait_for_weights(self) -> int:
        return self.svc.server.version

    def start(self) -> None:
        """Started in __init__ (so a restarted actor serves without the driver)."""

    def rpc(self, method, args, kwargs):
        return self.svc.rpc(method, args, kwargs)

    def stats(self) -> dict:
        return self.svc.stats()

    def status(self) -> tuple[int, str]:
        """(the version new episodes sample with, this incarnation's id)."""
        return self.svc.version(), self.incarnation

    def version(self) -> int:
        return self.svc.version()

    def pin(self, version: int) -> None:
        self.svc.pin(version)

    def stop(self) -> None:
        self.svc.stop()


def inference_options(settings) -> dict:
    """Ray options of the inference actor: restarted on a live node whenever it dies; only on
    nodes with the `settings.inference_resource` resource when one is named."""
    opts = dict(num_cpus=0, max_concurrency=settings.num_workers + 4, max_restarts=-1,
                max_task_retries=0)
    name = getattr(settings, "inference_resource", "")
    if name:
        opts["resources"] = {name: 1}
    return opts


class RayInference:
    """Driver-side handle of the inference actor, with InferenceService's interface. It notices
    restarts (a new incarnation) and keeps them in `events`: (time.time() it was first seen
    down or restarted, seconds until it answered again)."""

    POLL_DOWN_S = 0.5          # while the actor is down, ask at most this often

    def __init__(self, spec: ProgramSpec, store, settings):
        ray = self._ray = _ray()
        handle = getattr(store, "ray_handle", None)
        if handle is None:
            raise ConfigError("rl.job.backend=ray needs the weight store on Ray's object store "
                              "(backend_ray.make_ray_store)")
        actor = ray.remote(**inference_options(settings))(_InferenceActor)
        self.actor = actor.remote(spec.factory, spec.kwargs, handle, settings.weight_poll_s)
        self._version, self._incarnation = -1, None
        self._down_since: float | None = None
        self._next_poll = 0.0
        self._pinned: int | None = None
        self.restarts = 0
        self.events: list[tuple[float, float]] = []

    def wait_for_weights(self) -> int:
        self._version, self._incarnation = self._ray.get(self.actor.status.remote())
        return self._version

    def start(self) -> None:
        self._ray.get(self.actor.start.remote())

    def rpc(self, method, args, kwargs):
        return self._ray.get(self.actor.rpc.remote(method, args, kwargs))

    def version(self) -> int:
        """The actor's version; while it is down (restarting), the last one it reported."""
        now = time.monotonic()
        if self._down_since is not None and now < self._next_poll:
            return self._version
        try:
            version, inc = self._ray.get(self.actor.status.remote(),
                                         timeout=5 if self._down_since is None else 1)
        except Exception:  # noqa: BLE001 - died, restarting, or its node is not yet known dead
            if self._down_since is None:
                self._down_since = time.time()
            self._next_poll = now + self.POLL_DOWN_S
            return self._version
        restarted = inc != self._incarnation
        if restarted:
            down = self._down_since if self._down_since is not None else time.time()
            self.restarts += 1
            self.events.append((down, time.time() - down))
            print(f"warning: the inference actor restarted (version {version}, "
                  f"{time.time() - down:.1f}s after it was seen down)", file=sys.stderr)
        self._down_since, self._version, self._incarnation = None, version, inc
        if restarted and self._pinned is not None:
            self.pin(self._pinned)
        return version

    def pin(self, version: int) -> None:
        """Serve exactly `version` (rl/schedule.py); remembered, and pinned again on a restarted
        actor (which first loads the newest version: an episode started in between samples with
        that one, so `rl.schedule=reproducible` is not bit-reproducible across such a restart)."""
        self._pinned = version
        try:
            self._ray.get(self.actor.pin.remote(version), timeout=30)
        except Exception:  # noqa: BLE001 - down: pinned again once it is back (`version`)
            if self._down_since is None:
                self._down_since = time.time()

    def stats(self) -> dict:
        try:
            out = self._ray.get(self.actor.stats.remote(), timeout=30)
        except Exception as e:  # noqa: BLE001  (stats after a failure must not hide the failure)
            out = {"error": repr(e)}
        return {**out, "actor_restarts": self.restarts}

    def stop(self) -> None:
        try:
            self._ray.get(self.actor.stop.remote(), timeout=60)
        except Exception:  # noqa: BLE001 - already dead (its node lost): nothing to stop
            pass
        finally:
            self._ray.kill(self.actor, no_restart=True)


class RayPolicyClient:
    """PolicyClient inside a rollout worker actor: calls the inference actor. A call that fails
    because the actor died or is restarting waits until it answers again, then raises (the
    episode resumes from its last turn checkpoint on the fresh engine, `jobs.run_job`)."""

    def __init__(self, actor, back_timeout_s: float = BACK_TIMEOUT_S):
        self._ray, self.actor, self.back_timeout_s = _ray(), actor, back_timeout_s

    def call(self, method: str, *args, **kwargs):
        from ray.exceptions import RayActorError
        try:
            return self._ray.get(self.actor.rpc.remote(method, args, kwargs))
        except RayActorError:
            self.wait_until_back()
            raise

    def wait_until_back(self) -> None:
        deadline = time.monotonic() + self.back_timeout_s
        while time.monotonic() < deadline:
            try:
                self._ray.get(self.actor.status.remote(), timeout=10)
                return
            except Exception:  # noqa: BLE001 - still restarting
                time.sleep(0.5)
