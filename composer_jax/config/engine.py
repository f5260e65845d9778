"""The `inference` section: the inference engine's knobs (`--set inference.max_batch=...`)."""
from __future__ import annotations

import dataclasses

from composer_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """max_batch: decode slots (continuous batching); max_len: context per slot (cache length);
    max_queue: requests waiting for a slot before `submit` refuses more; speculative: sample with
    MTP speculative decoding (the model's MTP modules draft, the model verifies; tokens and
    behaviour log-probs are plain decoding's under the same seed); spec_depth: MTP drafts per step
    (0 = plain decoding unless `speculative`, which then drafts 1; > 0 implies speculation; <= the
    model's mtp_depth; `draft_depth` is the resolved count); capture_router: return the routed
    experts of every token; reprefill_on_swap: rebuild caches with the new weights on a weight
    swap (default: keep them); prefill_batch: rows per prefill call (requests admitted together
    are prefilled in groups of this many, padded); min_prefill_bucket: smallest padded prefill length (chunks are
    padded to powers of two so each length compiles once); seed: the engine's base PRNG seed;
    max_finished: finished completions kept in `Engine.completions` for lookup (the oldest are
    pruned first; `Engine.wait` collects one at once; futures keep their own result)."""
    max_batch: int = 8
    max_len: int = 1024
    max_queue: int = 256
    speculative: bool = False
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

    @property
    def draft_depth(self) -> int:
        """MTP drafts per decode step: spec_depth, or 1 with `speculative` and spec_depth 0;
        0 = plain decoding."""
        return self.spec_depth or int(self.speculative)

    def check_model(self, mtp_depth: int) -> None:
        """Speculation drafts with the model's MTP modules: refuses more drafts than it has."""
        if self.draft_depth > mtp_depth:
            what = ("has no MTP head (model.mtp_depth=0)" if mtp_depth == 0
                    else f"has model.mtp_depth={mtp_depth} MTP modules")
            who = ("inference.speculative=true" if self.speculative and not self.spec_depth
                   else f"inference.spec_depth={self.spec_depth}")
            fewer = f"lower inference.spec_depth to at most {mtp_depth}, " if mtp_depth else ""
            raise ConfigError(
                f"{who} drafts {self.draft_depth} token(s) per step with the model's MTP "
                f"modules, but the model {what}: set inference.speculative=false and "
                f"inference.spec_depth=0 for plain decoding, {fewer}or use a model trained with "
                f"MTP modules (model.mtp_depth >= {self.draft_depth})")
