"""Weight-store transport over Ray's object store (the `rl.backend=ray` backend).

A small named actor holds the index: key -> object reference, the commit records and the reader
positions. Committing is one actor call, so a version becomes visible all at once; deleting the
references lets Ray free the chunks.

Ray's ownership rule: an object belongs to the process that put it and is lost when that process
dies. Two modes:

- `mirror=True` (the run's store, `backend_ray.make_ray_store`): the publisher puts the chunks
  itself (it owns them: they live as long as the publisher, in its node's object store) and keeps
  its own copy of the index (every reference and commit record it wrote). The index actor runs
  on the publisher's node (pinned: with only a soft preference Ray placed it on another node of
  a two-node cluster), so only a loss that also ends the publisher takes it; when it dies anyway (`max_restarts=-1`)
  the restarted, empty index is refilled from the publisher's copy, at its next write or by the
  keeper thread within `keep_s` seconds. So no single actor holds the only copy, and a lost
  index node costs readers a short pause (they see no version, keep the one they hold). The
  publisher is the trainer in the driver: its death ends the run anyway (a rerun makes a new
  store).
- `mirror=False`, `durable=True` (default): the index actor puts the chunks itself, so they
  belong to it and a publisher killed at any point loses nothing committed (one extra copy);
  the index lives as long as the actor. `durable=False`: the publisher owns the chunks, without
  a copy of the index.

Reader positions (for garbage collection) are not mirrored: a reader sets its position again at
its next fetch, and a reader whose base version was collected meanwhile rebuilds from a full
snapshot.

`ray` is imported only when a RayTransport is built, so the rest of the store works without it.
"""
from __future__ import annotations

import threading
import time
import uuid

from composer_jax.rl.weights.codec import WeightStoreError
from composer_jax.rl.weights.transport import Transport, version_prefix


class _Index:
    """The index actor's body (plain Python; wrapped with ray.remote on first use). `generation`
    is new at every (re)start; a write that names another generation is refused (`write`), so a
    mirroring publisher refills a restarted index before anything else lands in it."""

    def __init__(self):
        self.refs: dict[str, list] = {}
        self.commits: dict[int, bytes] = {}
        self.reader_pos: dict[str, int] = {}
        self.generation = uuid.uuid4().hex

    def get_generation(self):
        return self.generation

    def write(self, expect, method, *args):
        """Applies `method(*args)` unless `expect` names an older generation; returns
        (generation, applied)."""
        if expect is not None and expect != self.generation:
            return self.generation, False
        getattr(self, method)(*args)
        return self.generation, True

    def restore(self, refs, commits):
        """Refills the index from a publisher's copy; returns the generation."""
        self.refs = dict(refs)
        self.commits = dict(commits)
        return self.generation

    def put_ref(self, key, boxed_ref):
        self.refs[key] = boxed_ref          # a list, so Ray passes the reference, not the value

    def put_blob(self, key, data):
        import ray
        self.refs[key] = [ray.put(data)]    # owned by this actor: survives the publisher

    def get_ref(self, key):
        return self.refs.get(key)

    def put_commit(self, version, data):
        self.commits[version] = data

    def get_commit(self, version):
        return self.commits.get(version)

    def committed(self):
        return sorted(self.commits)

    def delete_below(self, version, bound):
        for v in [v for v in self.commits if v < version]:
            del self.commits[v]
        for k in [k for k in self.refs if k < bound]:
            del self.refs[k]

    def delete_from(self, version, bound):
        for v in [v for v in self.commits if v >= version]:
            del self.commits[v]
        for k in [k for k in self.refs if k >= bound]:
            del self.refs[k]

    def keys(self):
        return sorted(self.refs)

    def set_reader(self, name, version):
        self.reader_pos[name] = version

    def remove_reader(self, name):
        self.reader_pos.pop(name, None)

    def readers(self):
        return dict(self.reader_pos)


def _ray():
    try:
        import ray
    except ImportError as e:
        raise WeightStoreError("the Ray weight transport needs `ray` (pip install ray, see "
                               "requirements.txt); use MemoryTransport or TensorStoreTransport "
                               "without it") from e
    if not ray.is_initialized():
        raise WeightStoreError("call ray.init() (or run inside a Ray job) before building a "
                               "RayTransport")
    return ray


class RayTransport(Transport):
    """Blobs in Ray's object store; index in a named actor `name` (in `namespace`) that every
    process of the job finds with the same name (module docstring for `mirror` and `durable`)."""

    def __init__(self, name: str = "composer_jax_weight_store", namespace: str | None = None, *,
                 durable: bool = True, lifetime: str | None = None, mirror: bool = False,
                 keep_s: float = 1.0):
        ray = self._ray = _ray()
        self.durable = durable and not mirror
        self.mirror = mirror
        opts = dict(name=name, namespace=namespace, get_if_exists=True, lifetime=lifetime,
                    max_restarts=-1, max_task_retries=-1)
        if mirror:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                ray.get_runtime_context().get_node_id(), soft=False)
        self._index = ray.remote(num_cpus=0)(_Index).options(**opts).remote()
        self.restores: list[float] = []     # time.time() of every refill of a restarted index
        self._refs: dict[str, list] = {}
        self._commits: dict[int, bytes] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._generation = None
        self._keeper: threading.Thread | None = None
        if mirror:
            self._generation = self._ray.get(self._index.get_generation.remote())
            self._keeper = threading.Thread(target=self._keep, args=(keep_s,),
                                            name="weight-index-keeper", daemon=True)
            self._keeper.start()

    # ---- the publisher's copy of the index (mirror=True)

    def _write(self, method, *args):
        """A mutating index call; a mirroring transport refills a restarted index first."""
        if not self.mirror:
            return self._call(method, *args)
        with self._lock:
            gen, applied = self._ray.get(self._index.write.remote(self._generation, method,
                                                                   *args))
            if not applied:                 # the index restarted: our copy already has this write
                self._restore()

    def _restore(self) -> None:
        with self._lock:
            self._generation = self._ray.get(self._index.restore.remote(self._refs,
                                                                        self._commits))
            self.restores.append(time.time())

    def _keep(self, period: float) -> None:
        """Refills a restarted index within `period` seconds even while nothing is published."""
        while not self._stop.wait(period):
            try:
                gen = self._ray.get(self._index.get_generation.remote(), timeout=60)
                if gen != self._generation:
                    self._restore()
            except Exception:  # noqa: BLE001 - restarting, or Ray shutting down: next period
                if not self._ray.is_initialized():
                    return

    def close(self) -> None:
        """Stops the keeper thread and waits for it (a refill it had begun finishes first, none
        starts after close returns); the index itself ends with the job."""
        self._stop.set()
        if self._keeper is not None:
            self._keeper.join()

    def _call(self, method, *args):
        return self._ray.get(getattr(self._index, method).remote(*args))

    def put_blob(self, key, data):
        if self.mirror:
            ref = [self._ray.put(bytes(data))]
            with self._lock:
                self._refs[key] = ref
                self._write("put_ref", key, ref)
        elif self.durable:
            self._call("put_blob", key, bytes(data))
        else:
            self._call("put_ref", key, [self._ray.put(bytes(data))])

    def get_blob(self, key):
        boxed = self._call("get_ref", key)
        if boxed is None:
            raise WeightStoreError(f"blob {key!r} is missing (garbage-collected or never written)")
        try:
            return self._ray.get(boxed[0])
        except Exception as e:  # noqa: BLE001 - ObjectLostError, OwnerDiedError, ...
            raise WeightStoreError(f"blob {key!r} was lost from Ray's object store ({e}); the "
                                   f"publisher that owned it is gone") from e

    def put_commit(self, version, data):
        with self._lock:
            if self.mirror:
                self._commits[version] = bytes(data)
            self._write("put_commit", version, bytes(data))

    def get_commit(self, version):
        data = self._call("get_commit", version)
        if data is None:
            raise WeightStoreError(f"version {version} is not committed")
        return data

    def committed_versions(self):
        return self._call("committed")

    def delete_below(self, version):
        bound = version_prefix(version)
        with self._lock:
            if self.mirror:
                self._commits = {v: c for v, c in self._commits.items() if v >= version}
                self._refs = {k: r for k, r in self._refs.items() if k >= bound}
            self._write("delete_below", version, bound)

    def delete_from(self, version):
        bound = version_prefix(version)
        with self._lock:
            if self.mirror:
                self._commits = {v: c for v, c in self._commits.items() if v < version}
                self._refs = {k: r for k, r in self._refs.items() if k < bound}
            self._write("delete_from", version, bound)

    def set_reader(self, name, version):
        self._call("set_reader", name, int(version))

    def remove_reader(self, name):
        self._call("remove_reader", name)

    def readers(self):
        return self._call("readers")
