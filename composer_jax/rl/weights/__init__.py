"""Weight sync: versioned, lossless, delta-compressed weights from the trainer to inference.

codec.py                   bit-pattern encoding (full chunks, sparse/XOR deltas, zstd, checksums)
transport.py               the transport interface and the in-process MemoryTransport
tensorstore_transport.py   a directory store on any TensorStore kvstore (zarr3 snapshots)
ray_transport.py           Ray's object store (imports ray lazily)
store.py                   WeightPublisher / WeightReader / WeightStore, garbage collection
engine_sync.py             fetch a version as an nnx.State for Engine.swap_weights
"""
from composer_jax.rl.weights.codec import CorruptWeightsError, DeltaCodec, WeightStoreError
from composer_jax.rl.weights.engine_sync import fetch_state, publishable, swap_from_store
from composer_jax.rl.weights.store import (PublishStats, WeightPublisher, WeightReader,
                                           WeightStore, WeightSyncSettings, collect_garbage)
from composer_jax.rl.weights.transport import MemoryTransport, Transport

__all__ = ["CorruptWeightsError", "DeltaCodec", "MemoryTransport", "PublishStats", "Transport",
           "WeightPublisher", "WeightReader", "WeightStore", "WeightStoreError",
           "WeightSyncSettings", "collect_garbage", "fetch_state", "publishable", "swap_from_store"]
