"""The `inference` section: the inference engine's knobs (`--set inference.max_batch=...`)."""
from __future__ import annotations

import dataclasses

from composer_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """max_batch: decode slots (continuous batching); max_len: context per slot (cache length);
    max_queue: requests waiting for a slot before `submit` refuses more; spec_depth: MTP drafts
    per step (0 = plain decoding; <= the model's mtp_depth); capture_router: return the routed
    experts of every token; reprefill_on_swap: rebuild caches with the new weights on a weight
    swap (default: keep them); prefill_batch: rows per prefill call (requests admitted together
    are prefilled in groups of this many, padded); min_prefill_bucket: smallest padded prefill length (chunks are
    padded to powers of two so each length compiles once); seed: the engine's base PRNG seed;
    max_finished: finished completions kept in `Engine.completions` for lookup (the oldest are
    pruned first; `Engine.wait` collects one at once; futures keep their own result)."""
    max_batch: int = 8
    max_len: int = 1024
    max_queue: int = 256
    spec_depth: int = 0
    capture_router: bool = False
    reprefill_on_swap: bool = False
    prefill_batch: int = 1
    min_prefill_bucket: int = 16
    seed: int = 0
    max_finished: int = 4096

    def __post_init__(self):
        for f in ("max_batch", "max_len", "max_queue", "prefill_batch", "min_prefill_bucket",
                  "max_finished"):
            if getattr(self, f) < 1:
                raise ConfigError(f"inference.{f} must be >= 1, got {getattr(self, f)}")
        if self.spec_depth < 0:
            raise ConfigError(f"inference.spec_depth must be >= 0, got {self.spec_depth}")
