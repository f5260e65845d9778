"""A weight-store directory written with TensorStore: any kvstore (file://, memory://, gs://, s3://).

Layout under the root:
  commits/v000000000007.json            commit record (written last = the version is visible)
  v000000000007/part-00000.json         one part manifest per publishing process
  v000000000007/delta/NAME/SHARD/CHUNK  delta chunks (zstd blobs, see codec.py)
  v000000000007/zarr/NAME/              full snapshots: one zarr3 array per tensor (uint bit
                                        patterns, zstd codec with checksum), readable by any zarr3
                                        tool; each process writes the region of its own shards
  readers/NAME.json                     the version each registered reader holds

Zarr snapshots store every chunk (all-zero ones too) and are read with missing chunks as errors,
so a chunk deleted by garbage collection while a reader reads it is reported missing (the reader
then starts over from the committed versions), never read back as zeros.

Atomic visibility comes from the commit record being a single key written after everything else:
the file driver writes a key through a temporary file and a rename, object stores replace an
object whole.
"""
from __future__ import annotations

import json

import numpy as np
import tensorstore as ts

from composer_jax.rl.weights.codec import CorruptWeightsError, WeightStoreError
from composer_jax.rl.weights.transport import Transport, version_prefix

_UINT_TS = {1: ts.uint8, 2: ts.uint16, 4: ts.uint32, 8: ts.uint64}


def _kvstore_spec(path: str):
    """A TensorStore kvstore spec from a path or URL ('/tmp/x', 'file:///tmp/x', 'memory://',
    'gs://bucket/dir'), always naming a directory."""
    if "://" not in path:
        path = "file://" + str(path)
    if not path.endswith("/"):
        path += "/"
    return path


class TensorStoreTransport(Transport):
    """Blobs are kvstore values; full snapshots are zarr3 arrays (zstd)."""

    def __init__(self, path: str, *, context: ts.Context | None = None):
        self.path = _kvstore_spec(path)
        self._ctx = context or ts.Context()
        try:
            self._kv = ts.KvStore.open(self.path, context=self._ctx).result()
        except Exception as e:  # noqa: BLE001 - tensorstore raises plain ValueError/OSError
            raise WeightStoreError(f"cannot open weight store at {path!r}: {e}; give a directory "
                                   f"or a kvstore URL (file://, memory://, gs://, s3://)") from e

    # ---- blobs
    def put_blob(self, key, data):
        self._kv.write(key, bytes(data)).result()

    def get_blob(self, key):
        r = self._kv.read(key).result()
        if r.state != "value":
            raise WeightStoreError(f"blob {self.path}{key} is missing (garbage-collected or never "
                                   f"written)")
        return bytes(r.value)

    def put_commit(self, version, data):
        self._kv.write(f"commits/{version_prefix(version)[:-1]}.json", bytes(data)).result()

    def get_commit(self, version):
        r = self._kv.read(f"commits/{version_prefix(version)[:-1]}.json").result()
        if r.state != "value":
            raise WeightStoreError(f"version {version} is not committed in {self.path}")
        return bytes(r.value)

    def committed_versions(self):
        keys = self._kv.list(ts.KvStore.KeyRange("commits/", "commits0")).result()
        out = []
        for k in keys:
            name = k.decode().rsplit("/", 1)[-1]
            if name.startswith("v") and name.endswith(".json"):
                out.append(int(name[1:-5]))
        return sorted(out)

    def delete_below(self, version):
        bound = version_prefix(version)[:-1]
        self._kv.delete_range(ts.KvStore.KeyRange("commits/v", f"commits/{bound}")).result()
        self._kv.delete_range(ts.KvStore.KeyRange("v", bound)).result()

    def delete_from(self, version):
        bound = version_prefix(version)[:-1]
        self._kv.delete_range(ts.KvStore.KeyRange(f"commits/{bound}", "commits/w")).result()
        self._kv.delete_range(ts.KvStore.KeyRange(bound, "w")).result()

    # ---- readers
    def set_reader(self, name, version):
        self._kv.write(f"readers/{name}.json", json.dumps({"version": int(version)}).encode()).result()

    def remove_reader(self, name):
        self._kv.delete_range(ts.KvStore.KeyRange(f"readers/{name}.json",
                                                  f"readers/{name}.json\x00")).result()

    def readers(self):
        out = {}
        for k in self._kv.list(ts.KvStore.KeyRange("readers/", "readers0")).result():
            r = self._kv.read(k).result()
            if r.state != "value":
                continue                          # unregistered while listing
            try:
                out[k.decode()[len("readers/"):-len(".json")]] = int(json.loads(r.value)["version"])
            except (ValueError, KeyError, TypeError):
                # A damaged position record: ignoring it can only let GC delete versions that
                # reader holds, which it then rebuilds from the newest snapshot.
                print(f"warning: unreadable reader record {self.path}{k.decode()}; ignored")
        return out

    # ---- full snapshots as zarr3 arrays
    def _zarr(self, version, name, *, shape=None, dtype=None, chunk=None, level=3):
        # Every chunk is stored, all-zero ones too, and a missing chunk is an error on read (never
        # TensorStore's default of reading it back as zeros): a chunk deleted by garbage collection
        # mid-read must be told apart from data.
        spec = {"driver": "zarr3",
                "kvstore": (self._kv / f"{version_prefix(version)}zarr/{name}/").spec().to_json(),
                "store_data_equal_to_fill_value": True, "fill_missing_data_reads": False}
        kw = {}
        if shape is not None:
            kw = dict(create=True, open=True, shape=list(shape), dtype=_UINT_TS[np.dtype(dtype).itemsize],
                      chunk_layout=ts.ChunkLayout(chunk_shape=list(chunk)),
                      codec=ts.CodecSpec({"driver": "zarr3", "codecs": [
                          {"name": "bytes", "configuration": {"endian": "little"}},
                          {"name": "zstd", "configuration": {"level": level, "checksum": True}}]}))
        return ts.open(spec, context=self._ctx, **kw).result()

    def write_full(self, version, name, shard_no, bits, *, global_shape, index, chunk_elems, level,
                   pool=None):
        shard_shape = bits.shape
        chunk = list(shard_shape) if shard_shape else []
        if chunk:
            # Split the shard along its first axis (by a divisor, so chunks never straddle two
            # shards and two processes never rewrite the same zarr chunk).
            inner = int(np.prod(chunk[1:])) if len(chunk) > 1 else 1
            want = max(1, chunk_elems // max(inner, 1))
            d = max(x for x in range(1, chunk[0] + 1) if chunk[0] % x == 0 and x <= want) \
                if chunk[0] else 1
            chunk[0] = d
        chunk = [max(c, 1) for c in chunk]
        arr = self._zarr(version, name, shape=global_shape, dtype=bits.dtype, chunk=chunk, level=level)
        region = tuple(slice(a, b) for a, b in index)
        arr[region].write(bits).result()
        return {"zarr": f"{version_prefix(version)}zarr/{name}/", "bytes": int(bits.nbytes)}

    def read_full(self, locator, shape, dtype, *, index, pool=None):
        version = int(locator["zarr"][1:13])
        name = locator["zarr"][len(version_prefix(version)) + len("zarr/"):-1]
        try:
            arr = self._zarr(version, name)
            region = tuple(slice(a, b) for a, b in index)
            data = arr[region].read().result()
        except Exception as e:  # noqa: BLE001 - a bad chunk surfaces as a generic tensorstore error
            if str(e).startswith("NOT_FOUND"):
                # Deleted (garbage collection racing the reader): the reader decides whether that
                # is a race (the version is no longer committed) or a damaged store.
                raise WeightStoreError(f"full snapshot {self.path}{locator['zarr']} is missing a "
                                       f"chunk or its metadata ({e})") from e
            raise CorruptWeightsError(f"full snapshot {self.path}{locator['zarr']} cannot be read "
                                      f"({e})") from e
        return np.ascontiguousarray(data).view(dtype).reshape(-1)
