"""Where a weight store keeps its bytes: the transport interface and the in-process transport.

A transport stores opaque blobs by key, one small commit record per published version, and the
positions of registered readers. Keys of a version's blobs all start with `version_prefix(v)`;
commit records live apart (under `commits/`) so listing the committed versions never lists chunks.

Atomicity contract (what makes a version all-or-nothing): a publisher writes every blob of a
version first and its commit record last; readers only ever look at committed versions, so a
publisher that dies half way leaves blobs nobody reads (collected later) and the previous version
intact. `delete_below(v)` removes commit records first, then blobs.

Full snapshots of a shard go through `write_full` / `read_full` so a transport may store them in
a richer format (the TensorStore transport writes zarr3 arrays); the default chunks the shard and
stores zstd blobs (codec.encode_full).
"""
from __future__ import annotations

import threading

import numpy as np

from composer_jax.rl.weights import codec
from composer_jax.rl.weights.codec import WeightStoreError


def version_prefix(version: int) -> str:
    """Key prefix of every blob of `version` (fixed width, so key order = version order)."""
    if version < 0 or version >= 10 ** 12:
        raise WeightStoreError(f"version must be in [0, 1e12), got {version}")
    return f"v{version:012d}/"


class Transport:
    """Blob storage interface (subclasses implement every method up to `readers`)."""

    def put_blob(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    def get_blob(self, key: str) -> bytes:
        """The blob; raises WeightStoreError if it does not exist."""
        raise NotImplementedError

    def put_commit(self, version: int, data: bytes) -> None:
        """Atomically makes `version` visible (called after all its blobs are written)."""
        raise NotImplementedError

    def get_commit(self, version: int) -> bytes:
        raise NotImplementedError

    def committed_versions(self) -> list[int]:
        """Sorted versions whose commit record exists."""
        raise NotImplementedError

    def delete_below(self, version: int) -> None:
        """Deletes the commit records, then the blobs, of every version < `version` (committed or
        torn)."""
        raise NotImplementedError

    def delete_from(self, version: int) -> None:
        """Deletes every blob (and commit record) of every version >= `version`: the publisher's
        clean-up of torn, uncommitted versions above the latest committed one."""
        raise NotImplementedError

    def set_reader(self, name: str, version: int) -> None:
        """Records that reader `name` holds `version` (-1: registered, holds nothing yet)."""
        raise NotImplementedError

    def remove_reader(self, name: str) -> None:
        raise NotImplementedError

    def readers(self) -> dict[str, int]:
        raise NotImplementedError

    # ---- full snapshots of one shard (default: chunked zstd blobs)

    def write_full(self, version: int, name: str, shard_no: str, bits: np.ndarray, *,
                   global_shape: tuple, index: tuple, chunk_elems: int, level: int,
                   pool=None) -> dict:
        """Stores one shard's bit patterns `bits` (shard shape, unsigned dtype); `shard_no` names
        the shard uniquely across publishing processes. Returns a JSON locator for read_full with
        the stored byte count under "bytes"."""
        flat = bits.reshape(-1)
        spans = codec.chunk_spans(flat.size, chunk_elems)
        base = f"{version_prefix(version)}full/{name}/{shard_no}/"

        def one(i_span):
            i, (s, e) = i_span
            blob = codec.encode_full(flat[s:e], level)
            self.put_blob(f"{base}{i}", blob)
            return [f"{base}{i}", s, e, len(blob)]

        chunks = list(_map(pool, one, list(enumerate(spans))))
        return {"chunks": chunks, "bytes": sum(c[3] for c in chunks)}

    def read_full(self, locator: dict, shape: tuple, dtype, *, index: tuple, pool=None) -> np.ndarray:
        """Inverse of write_full: the shard's bit patterns as a flat array of `dtype`."""
        n = int(np.prod(shape))
        out = np.empty(n, dtype)

        def one(c):
            key, s, e, _ = c
            out[s:e] = codec.decode_full(self.get_blob(key), e - s, dtype, what=key)

        list(_map(pool, one, locator["chunks"]))
        return out


def _map(pool, fn, items):
    return pool.map(fn, items) if pool is not None and len(items) > 1 else map(fn, items)


class MemoryTransport(Transport):
    """In-process transport (the local backend): a dict behind a lock. Share one instance between
    the trainer thread and the inference threads."""

    def __init__(self):
        self._blobs: dict[str, bytes] = {}
        self._commits: dict[int, bytes] = {}
        self._readers: dict[str, int] = {}
        self._lock = threading.Lock()

    def put_blob(self, key, data):
        with self._lock:
            self._blobs[key] = bytes(data)

    def get_blob(self, key):
        with self._lock:
            try:
                return self._blobs[key]
            except KeyError:
                raise WeightStoreError(f"blob {key!r} is missing (garbage-collected or never "
                                       f"written)") from None

    def put_commit(self, version, data):
        with self._lock:
            self._commits[version] = bytes(data)

    def get_commit(self, version):
        with self._lock:
            if version not in self._commits:
                raise WeightStoreError(f"version {version} is not committed")
            return self._commits[version]

    def committed_versions(self):
        with self._lock:
            return sorted(self._commits)

    def delete_below(self, version):
        bound = version_prefix(version)
        with self._lock:
            for v in [v for v in self._commits if v < version]:
                del self._commits[v]
            for k in [k for k in self._blobs if k < bound]:
                del self._blobs[k]

    def delete_from(self, version):
        bound = version_prefix(version)
        with self._lock:
            for v in [v for v in self._commits if v >= version]:
                del self._commits[v]
            for k in [k for k in self._blobs if k >= bound]:
                del self._blobs[k]

    def set_reader(self, name, version):
        with self._lock:
            self._readers[name] = int(version)

    def remove_reader(self, name):
        with self._lock:
            self._readers.pop(name, None)

    def readers(self):
        with self._lock:
            return dict(self._readers)

    def stored_bytes(self) -> int:
        """Total bytes of all blobs held (tests and benchmarks)."""
        with self._lock:
            return sum(len(b) for b in self._blobs.values())
