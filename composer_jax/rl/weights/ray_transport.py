"""Weight-store transport over Ray's object store (the `rl.backend=ray` backend).

A small named actor holds the index: key -> object reference, the commit records and the reader
positions. Committing is one actor call, so a version becomes visible all at once; deleting the
references lets Ray free the chunks.

Ray's ownership rule: an object belongs to the process that put it and is lost when that process
dies. By default (`durable=True`) the index actor puts the chunks itself, so they belong to it and
a publisher killed at any point loses nothing committed (the chunks pass through the actor once:
one extra copy). With `durable=False` the publisher puts them (no extra copy; they live in the
object store of the publisher's node): when the publisher dies, its versions become unreadable
(WeightStoreError; readers keep the version they hold; a restarted publisher starts again with a
full snapshot). Either way the index lives as long as the actor: create it from a process that
outlives the publisher (or pass `lifetime="detached"`).

`ray` is imported only when a RayTransport is built, so the rest of the store works without it.
"""
from __future__ import annotations

from composer_jax.rl.weights.codec import WeightStoreError
from composer_jax.rl.weights.transport import Transport, version_prefix


class _Index:
    """The index actor's body (plain Python; wrapped with ray.remote on first use)."""

    def __init__(self):
        self.refs: dict[str, list] = {}
        self.commits: dict[int, bytes] = {}
        self.reader_pos: dict[str, int] = {}

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
    process of the job finds with the same name."""

    def __init__(self, name: str = "composer_jax_weight_store", namespace: str | None = None, *,
                 durable: bool = True, lifetime: str | None = None):
        ray = self._ray = _ray()
        self.durable = durable
        actor = ray.remote(num_cpus=0)(_Index)
        self._index = actor.options(name=name, namespace=namespace, get_if_exists=True,
                                    lifetime=lifetime).remote()

    def _call(self, method, *args):
        return self._ray.get(getattr(self._index, method).remote(*args))

    def put_blob(self, key, data):
        if self.durable:
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
        self._call("put_commit", version, bytes(data))

    def get_commit(self, version):
        data = self._call("get_commit", version)
        if data is None:
            raise WeightStoreError(f"version {version} is not committed")
        return data

    def committed_versions(self):
        return self._call("committed")

    def delete_below(self, version):
        self._call("delete_below", version, version_prefix(version))

    def delete_from(self, version):
        self._call("delete_from", version, version_prefix(version))

    def set_reader(self, name, version):
        self._call("set_reader", name, int(version))

    def remove_reader(self, name):
        self._call("remove_reader", name)

    def readers(self):
        return self._call("readers")
