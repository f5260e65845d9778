"""Versioned, lossless, delta-compressed weights: trainer -> inference workers.

    transport = MemoryTransport()                      # or TensorStoreTransport(path), RayTransport()
    pub = WeightPublisher(transport, WeightSyncSettings.from_rl(cfg.rl))
    stats = pub.publish(7, params)                     # any pytree of arrays; returns PublishStats
    reader = WeightReader(transport, name="engine-0")  # registered: GC waits for it
    reader.latest()                                    # -> 7 (None while nothing is committed)
    flat = reader.fetch(7)                             # {"embed": bf16 array, ...}, bit-exact
    tree = reader.fetch_tree(7, like=params)           # same structure as `like`

`WeightStore` bundles one publisher and one reader (publish / fetch / latest).

What is shipped: the *inference copy*: every floating leaf cast to `dtype` (bf16) unless its name
matches a `keep_dtype` pattern (router selection biases stay fp32); the fp32 master never leaves
the trainer. Names are the leaves' pytree paths joined by "/" ("moe_layers/ffn/w_up").

Versions: each publishing process writes one *part* (its own shards, see below). A part is either
a full snapshot or a delta against the same part of the previous version: per shard, per chunk
of `chunk_elems` elements, the positions and XOR of the changed bit patterns, zstd-compressed
(codec.py; unchanged chunks store nothing). A part is full on the first publish, every
`full_snapshot_every` versions, when the shard layout changed, and whenever its delta would be
larger than its last full snapshot; a scheduled snapshot also stores the delta, so readers that
hold the previous version always fetch just the delta (the snapshot is for late joiners). Every shard carries a checksum of its bit patterns and every
tensor one over its shards; readers verify both after each rebuilt version.

Sharded trainers: a jax.Array leaf is published from this process's addressable shards with
replica_id 0 (no gather, no duplicates across processes); process 0 commits after a barrier. A
reader assembles whole tensors (numpy, on the host) and places them in its own layout
(engine_sync.py).

Readers: `fetch(v)` moves forward from the version the reader holds by applying the deltas in
between, or rebuilds from the newest full snapshots at or before v (also when a part's layout
changed: a tensor removed, reshaped or resharded, another process count). Garbage collection (run
by process 0 after each commit): versions older than both the newest snapshot chain and the oldest
version a registered reader still needs are deleted (torn, uncommitted writes with them); a new
publisher first deletes torn versions above the latest committed one (a crashed predecessor's).

Failures: a blob or commit record that disappears while a reader reads it (garbage collection)
makes the fetch start over from the committed versions; one missing, undecodable or failing its
checksum while its version is still committed, and any unreadable manifest or commit record,
raise CorruptWeightsError.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import fnmatch
import json
import os
import time
from typing import Any, Callable

import ml_dtypes
import numpy as np

from composer_jax.rl.weights import codec
from composer_jax.rl.weights.codec import CorruptWeightsError, DeltaCodec, WeightStoreError
from composer_jax.rl.weights.transport import MemoryTransport, Transport, version_prefix

FORMAT = 1


@dataclasses.dataclass(frozen=True)
class WeightSyncSettings:
    """How versions are encoded (RLConfig's rl.full_snapshot_every and rl.weight_sync_* fields)."""
    full_snapshot_every: int = 10
    dtype: str = "bfloat16"                  # the inference copy's dtype ("" = ship as is)
    keep_dtype: tuple[str, ...] = ("*bias",)  # fnmatch patterns of names shipped in their own dtype
    chunk_elems: int = 1 << 20
    codec: DeltaCodec = DeltaCodec.SPARSE
    zstd_level: int = 3
    threads: int = 0                         # encode/decode threads (0 = min(8, cpu count))

    def __post_init__(self):
        object.__setattr__(self, "codec", DeltaCodec(self.codec))
        if self.full_snapshot_every < 1 or self.chunk_elems < 1 or self.threads < 0:
            raise WeightStoreError("full_snapshot_every and chunk_elems must be >= 1, threads >= 0")
        if not 1 <= self.zstd_level <= 22:
            raise WeightStoreError(f"zstd_level must be in [1, 22], got {self.zstd_level}")
        if self.dtype:
            _np_dtype(self.dtype)

    @classmethod
    def from_rl(cls, rl) -> "WeightSyncSettings":
        """From an RLConfig (fields it lacks keep their defaults)."""
        kw = {"full_snapshot_every": rl.full_snapshot_every}
        for f in ("dtype", "keep_dtype", "chunk_elems", "codec", "zstd_level", "threads"):
            if hasattr(rl, "weight_sync_" + f):
                kw[f] = getattr(rl, "weight_sync_" + f)
        return cls(**kw)


@dataclasses.dataclass(frozen=True)
class PublishStats:
    """What one publish wrote (this process's part). ratio = raw_bytes / bytes."""
    version: int
    kind: str                 # "full" (a snapshot, possibly with a delta alongside) or "delta"
    bytes: int                # bytes a reader holding the previous version fetches (the delta
                              # when there is one; zarr snapshots count raw bytes)
    raw_bytes: int            # size of the shipped bit patterns (the full bf16 copy)
    changed: int              # elements whose bit pattern changed vs the previous version
    elements: int
    seconds: float
    stored_bytes: int = 0     # everything written for this version (snapshot + delta)

    @property
    def ratio(self) -> float:
        return self.raw_bytes / max(self.bytes, 1)

    @property
    def changed_fraction(self) -> float:
        return self.changed / max(self.elements, 1)


def _np_dtype(name: str) -> np.dtype:
    try:
        return np.dtype(getattr(ml_dtypes, name)) if hasattr(ml_dtypes, name) else np.dtype(name)
    except TypeError as e:
        raise WeightStoreError(f"unknown dtype {name!r}") from e


def _path_name(path) -> str:
    parts = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    return "/".join(parts)


def _plain_items(tree, prefix: str, out: dict) -> bool:
    """flatten() without JAX for nests of plain dicts/lists/tuples (same names and order as
    jax.tree_util); False if the tree holds anything else that JAX might treat as a node."""
    if type(tree) is dict:
        items = [(str(k), tree[k]) for k in sorted(tree)]
    elif type(tree) in (list, tuple):
        items = [(str(i), x) for i, x in enumerate(tree)]
    elif tree is None or not hasattr(tree, "dtype"):
        return False                      # None, custom nodes, Python scalars: let JAX decide
    else:
        if prefix in out:
            raise WeightStoreError(f"two leaves share the name {prefix!r}")
        out[prefix] = tree
        return True
    return all(_plain_items(x, f"{prefix}/{k}" if prefix else k, out) for k, x in items)


def flatten(tree) -> dict[str, Any]:
    """{name: leaf} with names = pytree paths joined by '/'. An nnx.State is taken as its pure
    dict. Plain nests of dicts/lists of arrays are walked without importing JAX."""
    plain: dict[str, Any] = {}
    if type(tree) is dict and _plain_items(tree, "", plain):
        return plain
    import jax
    if type(tree).__name__ == "State":
        from flax import nnx
        tree = nnx.to_pure_dict(tree)
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    out = {}
    for path, leaf in leaves:
        name = _path_name(path)
        if name in out:
            raise WeightStoreError(f"two leaves share the name {name!r}")
        out[name] = leaf
    return out


def _shards(leaf):
    """[(index ((start, stop) per dim), host numpy array)] of this process's unique shards."""
    shape = tuple(int(d) for d in np.shape(leaf))
    if hasattr(leaf, "addressable_shards"):
        out = []
        for s in leaf.addressable_shards:
            if s.replica_id != 0:
                continue
            idx = tuple(sl.indices(n)[:2] for sl, n in zip(s.index, shape))
            out.append((idx, np.asarray(s.data)))
        return out
    return [(tuple((0, n) for n in shape), np.asarray(leaf))]


def _ship_cast(leaf, name: str, s: WeightSyncSettings):
    """The inference copy of one leaf (cast on device, shard by shard, no gather)."""
    dt = np.dtype(leaf.dtype)
    if not s.dtype or any(fnmatch.fnmatchcase(name, p) for p in s.keep_dtype):
        return leaf
    target = _np_dtype(s.dtype)
    if dt.kind != "f" and dt != np.dtype(ml_dtypes.bfloat16) or dt == target:
        return leaf
    return leaf.astype(target)


def _shard_key(index) -> str:
    return ",".join(f"{a}:{b}" for a, b in index) or "scalar"


def _pool(threads: int):
    n = threads or min(8, os.cpu_count() or 1)
    return concurrent.futures.ThreadPoolExecutor(n) if n > 1 else None


class WeightPublisher:
    """The trainer side. One per publishing process; keeps the previous version's bit patterns of
    its own shards (host memory = one inference copy of those shards) as the delta base. One
    publishing job per store at a time: building a publisher deletes uncommitted versions."""

    def __init__(self, transport: Transport, settings: WeightSyncSettings = WeightSyncSettings(), *,
                 process_index: int | None = None, process_count: int | None = None,
                 barrier: Callable[[str], None] | None = None):
        self.t, self.s = transport, settings
        if process_index is None or process_count is None:
            import jax
        self.pi = jax.process_index() if process_index is None else process_index
        self.pn = jax.process_count() if process_count is None else process_count
        self._barrier = barrier
        self._prev: dict[tuple[str, str], np.ndarray] = {}
        self._prev_version: int | None = None
        self._last_full: int | None = None
        self._full_bytes = 0
        self._pool = _pool(settings.threads)
        self._clean = False                  # no torn version of ours above the latest committed
        self._delete_torn("init")

    def _delete_torn(self, tag: str) -> None:
        """Versions above the latest committed one are torn writes of a crashed (or failed)
        publisher: process 0 deletes them before this publisher writes anything (then a barrier),
        so a version can be republished with another chunking, shape or dtype and nothing
        uncommitted is left behind."""
        if self.pi == 0:
            committed = self.t.committed_versions()
            self.t.delete_from(committed[-1] + 1 if committed else 0)
        self._sync(f"composer_jax_weights_clean_{tag}")
        self._clean = True

    def _sync(self, tag: str) -> None:
        if self._barrier is not None:
            self._barrier(tag)
        elif self.pn > 1:
            from jax.experimental import multihost_utils
            multihost_utils.sync_global_devices(tag)

    def publish(self, version: int, params) -> PublishStats:
        """Writes `version` of `params` (any pytree of jax/numpy arrays; nnx.State works) and makes
        it visible atomically. Versions must increase. Returns this process's PublishStats."""
        t0 = time.perf_counter()
        committed = self.t.committed_versions()
        if committed and version <= committed[-1]:
            raise WeightStoreError(f"version {version} must be greater than the latest committed "
                                   f"version {committed[-1]}")
        if not self._clean:
            self._delete_torn(f"retry_{version}")    # the previous publish failed half way
        self._clean = False                  # until this publish completes
        shards = {}
        for name, leaf in flatten(params).items():
            shipped = _ship_cast(leaf, name, self.s)
            shards[name] = (tuple(int(d) for d in np.shape(shipped)), np.dtype(shipped.dtype),
                            _shards(shipped))
        layout_same = self._prev_version is not None and set(self._prev) == {
            (n, _shard_key(i)) for n, (_, _, ss) in shards.items() for i, _ in ss} and all(
            self._prev[(n, _shard_key(i))].dtype == codec.bits_view(a).dtype
            and self._prev[(n, _shard_key(i))].size == a.size
            for n, (_, _, ss) in shards.items() for i, a in ss)
        due = self._last_full is None or version - self._last_full >= self.s.full_snapshot_every
        part = delta = None
        if layout_same:
            delta = self._encode(version, shards, delta=True)
            if delta["bytes"] > self._full_bytes:
                delta = None                 # the delta would be larger than a snapshot
        if delta is not None and not due:
            part = delta
            part["stored_bytes"] = part["bytes"]
        else:
            part = self._encode(version, shards, delta=False)
            self._last_full, self._full_bytes = version, part["bytes"]
            part["stored_bytes"] = part["bytes"]
            if delta is not None:
                # A scheduled snapshot also carries the delta: readers that hold the previous
                # version fetch only the delta; the snapshot serves late joiners and GC.
                part["delta"] = {"base": delta["base"], "bytes": delta["bytes"],
                                 "tensors": delta["tensors"]}
                part["stored_bytes"] += delta["bytes"]
                part["changed"] = delta["changed"]
        part_key = f"{version_prefix(version)}part-{self.pi:05d}.json"
        self.t.put_blob(part_key, json.dumps(part).encode())
        self._sync(f"composer_jax_weights_publish_{version}")
        if self.pi == 0:
            self._commit(version)
        self._sync(f"composer_jax_weights_commit_{version}")
        self._prev = {(n, _shard_key(i)): codec.bits_view(a).reshape(-1).copy()
                      for n, (_, _, ss) in shards.items() for i, a in ss}
        self._prev_version = version
        self._clean = True
        if self.pi == 0:
            collect_garbage(self.t)
        sent = part["delta"]["bytes"] if "delta" in part else part["bytes"]
        return PublishStats(version, part["kind"], sent, part["raw_bytes"], part["changed"],
                            part["elements"], time.perf_counter() - t0, part["stored_bytes"])

    def _encode(self, version: int, shards: dict, delta: bool) -> dict:
        tensors, total, raw, changed, elements = {}, 0, 0, 0, 0
        for name, (shape, dtype, ss) in shards.items():
            entries = []
            for no, (index, arr) in enumerate(ss):
                sid = f"p{self.pi}s{no}"      # unique across processes (blob keys)
                bits = codec.bits_view(arr)
                flat = bits.reshape(-1)
                entry = {"index": [list(p) for p in index], "checksum": codec.checksum(bits)}
                if delta:
                    loc, nbytes, nchanged = self._encode_delta(
                        version, name, sid, flat, self._prev[(name, _shard_key(index))])
                    changed += nchanged
                else:
                    loc = self.t.write_full(version, name, sid, bits, global_shape=shape, index=index,
                                            chunk_elems=self.s.chunk_elems, level=self.s.zstd_level,
                                            pool=self._pool)
                    nbytes = loc["bytes"]
                    prev = self._prev.get((name, _shard_key(index)))
                    if prev is not None and prev.shape == flat.shape and prev.dtype == flat.dtype:
                        changed += int(np.count_nonzero(prev != flat))
                    else:
                        changed += flat.size
                entry["loc"] = loc
                entries.append(entry)
                total += nbytes
                raw += bits.nbytes
                elements += flat.size
            tensors[name] = {"shape": list(shape), "dtype": dtype.name, "shards": entries}
        return {"format": FORMAT, "version": version, "part": self.pi,
                "kind": "delta" if delta else "full", "base": self._prev_version if delta else None,
                "codec": self.s.codec.value, "bytes": total, "raw_bytes": raw, "changed": changed,
                "elements": elements, "tensors": tensors}

    def _encode_delta(self, version, name, sid, flat, prev):
        spans = codec.chunk_spans(flat.size, self.s.chunk_elems)
        base = f"{version_prefix(version)}delta/{name}/{sid}/"

        def one(i_span):
            i, (s, e) = i_span
            blob = codec.encode_delta(flat[s:e], prev[s:e], self.s.codec, self.s.zstd_level)
            if blob is None:
                return None, 0
            self.t.put_blob(f"{base}{i}", blob)
            return [f"{base}{i}", s, e, len(blob)], int(np.count_nonzero(flat[s:e] != prev[s:e]))

        pool = self._pool if len(spans) > 1 else None
        results = list(pool.map(one, list(enumerate(spans))) if pool else map(one, enumerate(spans)))
        chunks = [c for c, _ in results if c is not None]
        return {"chunks": chunks}, sum(c[3] for c in chunks), sum(n for _, n in results)

    def _commit(self, version: int) -> None:
        parts = [json.loads(self.t.get_blob(f"{version_prefix(version)}part-{p:05d}.json"))
                 for p in range(self.pn)]
        sums: dict[str, list] = {}
        for part in parts:
            for name, t in part["tensors"].items():
                for sh in t["shards"]:
                    sums.setdefault(name, []).append((sh["index"], sh["checksum"]))
        record = {"format": FORMAT, "version": version, "parts": self.pn,
                  "kinds": [p["kind"] for p in parts], "bases": [p["base"] for p in parts],
                  "bytes": sum(p["bytes"] for p in parts),
                  "raw_bytes": sum(p["raw_bytes"] for p in parts),
                  "tensor_checksums": {n: codec.combine_checksums([c for _, c in sorted(v)])
                                       for n, v in sums.items()}}
        self.t.put_commit(version, json.dumps(record).encode())


def _json(data: bytes, what: str) -> dict:
    """A stored JSON record; anything unreadable is the store's corruption error."""
    try:
        out = json.loads(data)
    except ValueError as e:                 # JSONDecodeError, UnicodeDecodeError
        raise CorruptWeightsError(f"{what} is not valid JSON ({e}); the store is corrupt, "
                                  f"republish") from e
    if not isinstance(out, dict):
        raise CorruptWeightsError(f"{what} is not a JSON object; the store is corrupt, republish")
    return out


def _commit_record(t: Transport, version: int) -> dict:
    """The validated commit record of `version` (WeightStoreError if it is not committed,
    CorruptWeightsError if it does not parse)."""
    rec = _json(t.get_commit(version), f"commit record of version {version}")
    parts, kinds = rec.get("parts"), rec.get("kinds")
    if (not isinstance(parts, int) or parts < 1 or not isinstance(kinds, list)
            or len(kinds) != parts or any(k not in ("full", "delta") for k in kinds)
            or not isinstance(rec.get("tensor_checksums"), dict)):
        raise CorruptWeightsError(f"commit record of version {version} is malformed (parts, "
                                  f"kinds or tensor_checksums); the store is corrupt, republish")
    return rec


def _chain_start(records: dict[int, dict], version: int) -> int | None:
    """The oldest version needed to rebuild `version` from full snapshots (None: impossible)."""
    need = set(range(records[version]["parts"]))
    for v in sorted((v for v in records if v <= version), reverse=True):
        rec = records[v]
        if rec["parts"] != records[version]["parts"]:
            return None
        need -= {p for p, k in enumerate(rec["kinds"]) if k == "full"}
        if not need:
            return v
    return None


def collect_garbage(t: Transport, torn: bool = False) -> int | None:
    """Deletes every version no reader needs (see module doc); returns the oldest version kept.
    `torn=True` also deletes uncommitted versions above the latest (only safe while no publisher
    is writing one; a publisher does it itself before its first write)."""
    versions = t.committed_versions()
    if torn:
        t.delete_from(versions[-1] + 1 if versions else 0)
    if not versions:
        return None
    records = {v: _commit_record(t, v) for v in versions}
    keep = _chain_start(records, versions[-1])
    if keep is None:
        return None
    held = [v for v in t.readers().values() if v >= 0]
    if held:
        keep = min(keep, min(held) + 1)
        later = [v for v in versions if v >= keep]
        keep = later[0] if later else keep
    t.delete_below(keep)
    return keep


@dataclasses.dataclass
class _State:
    """What a reader holds: the arrays of one version and how they were built (internal).
    layouts: part -> {(tensor, shard key): (shape, dtype name)} of the part last applied;
    sums: (tensor, shard key) -> the verified checksum of that shard."""
    arrays: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    part_version: dict[int, int] = dataclasses.field(default_factory=dict)
    layouts: dict[int, dict] = dataclasses.field(default_factory=dict)
    sums: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)

    def copy(self) -> "_State":
        return _State(dict(self.arrays), dict(self.part_version), dict(self.layouts),
                      dict(self.sums))


def _layout(part: dict) -> dict:
    return {(name, _shard_key(tuple(tuple(p) for p in sh["index"]))): (tuple(t["shape"]),
                                                                      t["dtype"])
            for name, t in part["tensors"].items() for sh in t["shards"]}


_MALFORMED = (KeyError, TypeError, ValueError, IndexError, AttributeError)


class WeightReader:
    """The inference side: rebuilds versions bit for bit on the host. With a `name`, the reader is
    registered with the store and garbage collection keeps what it still needs.

    Failure handling: a commit record or blob that vanishes while it is read (the publisher's
    garbage collection) makes the fetch start over from the then-committed versions; a version
    whose layout changed (a leaf removed, reshaped or resharded; another process count) is rebuilt
    from the newest full snapshots; a blob that is missing, undecodable or fails its checksum
    while its version is still committed raises CorruptWeightsError."""

    ATTEMPTS = 5

    def __init__(self, transport: Transport, name: str | None = None, threads: int = 0):
        self.t, self.name = transport, name
        self._state = _State()
        self.version: int | None = None
        self._pool = _pool(threads)
        if name is not None:
            transport.set_reader(name, -1)

    def latest(self) -> int | None:
        """The newest committed version (None while nothing is published)."""
        v = self.t.committed_versions()
        return v[-1] if v else None

    def close(self) -> None:
        """Unregisters the reader (GC stops waiting for it)."""
        if self.name is not None:
            self.t.remove_reader(self.name)

    def fetch(self, version: int | None = None) -> dict[str, np.ndarray]:
        """{name: array} of `version` (None = latest), bit for bit as published, in the shipped
        dtypes. The arrays are read-only and never modified by later fetches (unchanged tensors
        are shared between versions)."""
        for attempt in range(self.ATTEMPTS):
            versions = self.t.committed_versions()
            if not versions:
                raise WeightStoreError("nothing has been published yet")
            target = versions[-1] if version is None else version
            if target not in versions:
                raise WeightStoreError(
                    f"version {target} is not available (committed: {versions[0]}..{versions[-1]}"
                    f"{'' if target > versions[0] else '; older versions were garbage-collected'})")
            try:
                self._advance(target, versions)
                break
            except _Gone:
                if attempt == self.ATTEMPTS - 1:
                    raise WeightStoreError(f"version {target} kept disappearing while it was read "
                                           f"(garbage-collected by the publisher); fetch latest()")
        if self.name is not None:
            self.t.set_reader(self.name, target)
        return dict(self._state.arrays)

    def fetch_tree(self, version: int | None, like):
        """The fetched version in the structure of the pure pytree `like` (nested dicts/lists of
        arrays; names must match; dtypes are the shipped ones). For an nnx.State use
        engine_sync.fetch_state."""
        import jax
        flat = self.fetch(version)
        names = flatten(like)
        missing = sorted(set(names) - set(flat))
        if missing:
            raise WeightStoreError(f"published weights lack {missing[:5]} (of {len(missing)})")
        leaves = [flat[n] for n in names]
        return jax.tree.unflatten(jax.tree.structure(like), leaves)

    # ---- internals
    def _advance(self, target: int, versions: list[int]) -> None:
        if self.version == target:
            return
        if self.version is not None and self.version < target:
            path = [v for v in versions if self.version < v <= target]
            try:
                self._commit_state(target, self._apply_all(path, self._state.copy(), None))
                return
            except _Broken:
                pass                          # a delta base is gone or the layout changed
        records = {}
        for v in reversed([v for v in versions if v <= target]):
            records[v] = self._guarded(v, lambda v=v: _commit_record(self.t, v))
            start = _chain_start(records, target)
            if start is not None:
                break
        else:
            raise WeightStoreError(f"version {target} cannot be rebuilt: no full snapshot of every "
                                   f"part at or before it")
        path = [v for v in versions if start <= v <= target]
        # Each part starts from its own newest snapshot in the path (earlier ones may have another
        # layout: removed, reshaped or resharded tensors).
        first = {p: max(v for v in path if records[v]["kinds"][p] == "full")
                 for p in range(records[target]["parts"])}
        try:
            self._commit_state(target, self._apply_all(path, _State(), first))
        except _Broken as e:
            raise CorruptWeightsError(f"version {target} cannot be rebuilt from its snapshots: "
                                      f"{e}") from e

    def _commit_state(self, target: int, state: _State) -> None:
        self._state, self.version = state, target

    def _guarded(self, v: int, fn):
        """Runs a read of version `v`, telling a garbage-collection race (v is no longer committed:
        _Gone, the fetch starts over) from corruption (v is still committed)."""
        try:
            return fn()
        except _Broken:
            raise
        except (WeightStoreError, *_MALFORMED) as e:
            if v not in self.t.committed_versions():
                raise _Gone() from e
            if isinstance(e, CorruptWeightsError):
                raise
            if isinstance(e, WeightStoreError):
                raise CorruptWeightsError(f"version {v} is committed but cannot be read: {e}; the "
                                          f"store is corrupt, republish") from e
            raise CorruptWeightsError(f"version {v}: a manifest is malformed ({type(e).__name__}: "
                                      f"{e}); the store is corrupt, republish") from e

    def _apply_all(self, path, st: _State, first: dict | None) -> _State:
        """Applies the versions in `path` to `st` (modified). `first` (rebuilding): part -> the
        version of its newest snapshot in the path (its earlier versions are skipped); None:
        moving forward from what the reader holds."""
        for v in path:
            self._guarded(v, lambda v=v: self._apply_version(v, st, first))
        return st

    def _apply_version(self, v: int, st: _State, first: dict | None) -> None:
        rec = _commit_record(self.t, v)
        rebuild = first is not None
        if not rebuild and set(st.part_version) != set(range(rec["parts"])):
            raise _Broken(f"version {v} has {rec['parts']} parts, the reader holds "
                          f"{len(st.part_version)}")
        fresh = set()                         # tensors already copied for this version
        for p in range(rec["parts"]):
            if rebuild and v < first[p]:
                continue                      # this part's snapshot comes later in the path
            key = f"{version_prefix(v)}part-{p:05d}.json"
            part = _json(self.t.get_blob(key), f"part manifest {key}")
            alongside = part.get("delta")
            if alongside is not None and p in st.part_version \
                    and st.part_version[p] == alongside["base"]:
                part = {**part, **alongside, "kind": "delta"}   # fetch only the delta
            layout = _layout(part)
            if part["kind"] == "delta":
                if st.part_version.get(p) != part["base"]:
                    raise _Broken(f"part {p} of version {v} is a delta against version "
                                  f"{part['base']}, the reader holds {st.part_version.get(p)}")
                if layout != st.layouts.get(p):
                    raise CorruptWeightsError(f"part {p} of version {v}: a delta with another "
                                              f"layout than its base; the store is corrupt")
            elif p in st.layouts and layout != st.layouts[p]:
                # The layout changed (a tensor removed, reshaped or resharded): the held arrays and
                # checksums of the old layout must not leak into the new version.
                raise _Broken(f"part {p} of version {v} has a new layout")
            self._apply_part(part, st, fresh)
            st.part_version[p], st.layouts[p] = v, layout
        for name in fresh:
            st.arrays[name].flags.writeable = False
        if all(p in st.part_version for p in range(rec["parts"])):
            names = {n for lay in st.layouts.values() for n, _ in lay}
            if names != set(rec["tensor_checksums"]) or set(st.arrays) != names:
                raise CorruptWeightsError(f"version {v}: the parts hold tensors {sorted(names)[:5]}"
                                          f", the commit record {sorted(rec['tensor_checksums'])[:5]}"
                                          f"; the store is corrupt")
            self._verify_tensors(rec, st.sums, v)

    def _apply_part(self, part, st: _State, fresh):
        arrays, sums = st.arrays, st.sums
        delta = part["kind"] == "delta"
        for name, t in part["tensors"].items():
            shape, dtype = tuple(t["shape"]), _np_dtype(t["dtype"])
            if delta and name not in arrays:
                raise _Broken(f"tensor {name} is missing from the reader's base")
            if not delta and name not in fresh and (
                    name not in arrays or arrays[name].shape != shape or arrays[name].dtype != dtype):
                arrays[name] = np.zeros(shape, dtype)
                fresh.add(name)

            def writable(name=name):
                # Copy on first write in this version: arrays handed out earlier never change,
                # and unchanged tensors are shared between versions (read-only).
                if name not in fresh:
                    arrays[name] = arrays[name].copy()
                    fresh.add(name)
                return codec.bits_view(arrays[name])
            for sh in t["shards"]:
                index = tuple(tuple(int(x) for x in p) for p in sh["index"])
                region = tuple(slice(a, b) for a, b in index)
                sshape = tuple(b - a for a, b in index)
                key = (name, _shard_key(index))
                what = f"{name} shard {key[1]} of version {part['version']}"
                chunks = sh["loc"]["chunks"] if delta else None
                if delta and not chunks:
                    # Unchanged shard: its checksum must equal the one verified before.
                    if sums.get(key) != sh["checksum"]:
                        raise CorruptWeightsError(f"{what}: stored as unchanged but its checksum "
                                                  f"differs from the previous version's")
                    continue
                bits_dtype = codec.bits_view(arrays[name]).dtype
                if delta:
                    flat = np.array(codec.bits_view(arrays[name])[region]).reshape(-1)
                    for ckey, s, e, _ in chunks:
                        flat[s:e] = codec.apply_delta(self.t.get_blob(ckey), flat[s:e],
                                                      DeltaCodec(part["codec"]), what=ckey)
                else:
                    flat = self.t.read_full(sh["loc"], sshape, bits_dtype, index=index,
                                            pool=self._pool)
                if codec.checksum(flat) != sh["checksum"]:
                    raise CorruptWeightsError(f"{what}: checksum mismatch (stored chunks are "
                                              f"corrupt); fetch another version or republish")
                writable()[region] = flat.reshape(sshape)
                sums[key] = sh["checksum"]

    @staticmethod
    def _verify_tensors(rec, sums, v):
        by_tensor: dict[str, list] = {}
        for (name, skey), c in sums.items():
            by_tensor.setdefault(name, []).append((
                [tuple(int(x) for x in p.split(":")) for p in skey.split(",")] if skey != "scalar"
                else [], c))
        for name, want in rec["tensor_checksums"].items():
            got = codec.combine_checksums([c for _, c in sorted(by_tensor.get(name, []))])
            if got != want:
                raise CorruptWeightsError(f"version {v}: tensor {name}'s checksum {got} differs "
                                          f"from the published {want} (missing or corrupt shards)")


class _Broken(Exception):
    """The reader's state cannot be moved forward along this path (internal)."""


class _Gone(Exception):
    """A needed commit or blob vanished (garbage-collected while reading) (internal)."""


class WeightStore:
    """One publisher and one reader over a transport: the stable `publish / fetch / latest`.
    `reader_name` registers the reader for garbage collection (unique per reader process);
    publisher keywords (process_index, process_count, barrier) go to WeightPublisher."""

    def __init__(self, transport: Transport | None = None,
                 settings: WeightSyncSettings = WeightSyncSettings(), *, reader_name: str | None = None,
                 **publisher_kw):
        self.transport = transport if transport is not None else MemoryTransport()
        self.settings = settings
        self._publisher_kw = publisher_kw
        self._publisher: WeightPublisher | None = None
        self.reader = WeightReader(self.transport, reader_name, settings.threads)

    @property
    def publisher(self) -> WeightPublisher:
        if self._publisher is None:
            self._publisher = WeightPublisher(self.transport, self.settings, **self._publisher_kw)
        return self._publisher

    def publish(self, version: int, params) -> PublishStats:
        return self.publisher.publish(version, params)

    def fetch(self, version: int | None = None) -> dict[str, np.ndarray]:
        return self.reader.fetch(version)

    def latest(self) -> int | None:
        return self.reader.latest()
