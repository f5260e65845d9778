"""Knobs of the inference engine: `EngineConfig` is the `inference` section of
`composer_jax.config.Config` (so `--set inference.max_batch=16` works); re-exported here beside
the engine."""
from composer_jax.config import EngineConfig

__all__ = ["EngineConfig"]
