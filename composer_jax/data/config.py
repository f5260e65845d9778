"""The `data` section moved to `composer_jax.config.data` (config modules live below everything
they configure); this module keeps the old import path working."""
from composer_jax.config.data import (CACHE_ENV_VAR, DEFAULT_CACHE_DIR, CopySource, DataConfig,  # noqa: F401
                                      SftSource, SplitPattern, TurnWindows, resolved_cache_dir)
