"""The grain input pipelines: pretraining, evaluation and SFT batches in the train step's format.

Batch (numpy; B = per-host batch = global_batch_size / process_count, T = seq_len, Dm = mtp_depth):
  tokens [B,T] int32, positions [B,T] int32, segment_ids [B,T] int32 (0 = padding),
  targets [B,T] int32, loss_mask [B,T] float32, mtp_targets [B,Dm,T] int32,
  mtp_mask [B,Dm,T] float32
(see `targets.py` for the exact rules).

Pipeline: `grain.MapDataset.range(rows_per_epoch).repeat()` -> `map_with_index` builds packed row i
(epoch = i // rows_per_epoch, so every epoch is reshuffled) -> `batch(B)` -> `[process_index ::
process_count]` -> `map(add_targets)` -> `to_iter_dataset(ReadOptions)` (threads) -> optional
`mp_prefetch` (`num_workers` > 0). Global batch g is rows [g·G, (g+1)·G) (G = global batch); host p
gets rows [g·G + p·B, g·G + (p+1)·B): hosts are disjoint and their union is the global batch.
Everything is random access, so the iterator state is grain's `{"next_index": n}` plus metadata
that `set_state` checks (a state from another dataset or batch size is refused).
"""

from __future__ import annotations

import dataclasses

import grain
import numpy as np

from composer_jax.data import packing, targets
from composer_jax.data.config import DataConfig
from composer_jax.data.copy_rows import CopySpans
from composer_jax.data.errors import DataError
from composer_jax.data.shards import TokenStore


@dataclasses.dataclass(frozen=True)
class RowBuilder:
    """grain `map_with_index` transform: global row index -> packed row arrays `[T]` (with `copy`,
    some rows become copy rows, chosen by the global index: `copy_rows.py`)."""

    layout: packing.StreamLayout | packing.BinLayout
    store: TokenStore
    pad_id: int
    copy: CopySpans | None = None

    def __call__(self, index: int, row: int) -> dict[str, np.ndarray]:
        rows = self.layout.rows_per_epoch
        epoch = index // rows if rows else 0
        pieces = self.layout.pieces(epoch, row) if row < rows else []
        arrays = packing.assemble_row(pieces, self.store, self.layout.seq_len, self.pad_id)
        return self.copy(index, arrays) if self.copy is not None else arrays


@dataclasses.dataclass(frozen=True)
class TargetsBuilder:
    """grain `map` transform: stacked rows `[B, T]` -> the batch contract (`value_weight`: the loss
    weight of argument values' first tokens, `targets.loss_weights`)."""

    mtp_depth: int
    value_weight: float = 1.0

    def __call__(self, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return targets.add_targets(rows, self.mtp_depth, self.value_weight)


class DataIterator:
    """Infinite iterator of batches. `get_state()` -> small JSON-able dict; `set_state(state)`."""

    def __init__(self, dataset: grain.IterDataset, meta: dict):
        self._iterator = iter(dataset)
        self.meta = meta

    def __iter__(self) -> "DataIterator":
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        return next(self._iterator)

    def get_state(self) -> dict:
        return {"grain": self._iterator.get_state(), "meta": dict(self.meta)}

    def set_state(self, state: dict) -> None:
        if not isinstance(state, dict) or "grain" not in state or "meta" not in state:
            raise DataError(f"not a data iterator state: {str(state)[:200]}")
        if state["meta"] != self.meta:
            diff = {k: (state["meta"].get(k), v) for k, v in self.meta.items() if state["meta"].get(k) != v}
            raise DataError(f"data iterator state does not match this pipeline (saved, current): {diff}")
        self._iterator.set_state(state["grain"])

    def close(self) -> None:
        close = getattr(self._iterator, "close", None)
        if close is not None:
            close()


def per_host_batch(cfg: DataConfig, process_index: int, process_count: int) -> int:
    """B = global_batch_size / process_count; a ConfigError-style DataError when it does not divide."""
    if process_count < 1 or not 0 <= process_index < process_count:
        raise DataError(f"process_index={process_index} must be in [0, process_count={process_count})")
    if cfg.global_batch_size % process_count:
        raise DataError(f"data.global_batch_size={cfg.global_batch_size} is not divisible by the "
                        f"{process_count} processes (hosts)")
    return cfg.global_batch_size // process_count


def batched_rows(rows: RowBuilder, per_host: int, process_index: int, process_count: int, mtp_depth: int,
                 num_rows: int | None = None, value_weight: float = 1.0) -> grain.MapDataset:
    """MapDataset of this host's batches: infinite (epochs repeat) or over the first `num_rows` rows."""
    if num_rows is None:
        if rows.layout.rows_per_epoch < per_host * process_count:
            raise DataError(f"the data has {rows.layout.rows_per_epoch} rows of {rows.layout.seq_len} tokens "
                            f"per epoch, fewer than one global batch ({per_host * process_count} rows): use a "
                            "larger corpus or a smaller data.seq_len / data.global_batch_size")
        ds = grain.MapDataset.range(rows.layout.rows_per_epoch).repeat()
    else:
        ds = grain.MapDataset.range(num_rows)
    ds = ds.map_with_index(rows).batch(per_host, drop_remainder=True)
    return ds[process_index::process_count].map(TargetsBuilder(mtp_depth, value_weight))


def iterate(cfg: DataConfig, batches: grain.MapDataset, meta: dict, start_state: dict | None) -> DataIterator:
    """A resumable DataIterator over `batches` with the configured threads / worker processes."""
    ds = batches.to_iter_dataset(grain.ReadOptions(num_threads=cfg.num_threads,
                                                   prefetch_buffer_size=cfg.prefetch_buffer_size))
    if cfg.num_workers > 0:
        _ensure_flags_parsed()
        ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=cfg.num_workers))
    iterator = DataIterator(ds, meta)
    if start_state is not None:
        iterator.set_state(start_state)
    return iterator


def _ensure_flags_parsed() -> None:
    """grain's worker processes read absl flags; outside an absl app (tests, notebooks) use defaults."""
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def check_mtp_depth(mtp_depth: int) -> None:
    if isinstance(mtp_depth, bool) or not isinstance(mtp_depth, int) or mtp_depth < 0:
        raise DataError(f"mtp_depth={mtp_depth!r}: must be an integer >= 0 (the model's number of MTP modules)")
