"""The `env` section moved to `composer_jax.config.env` (config modules live below everything they
configure); this module keeps the old import path working."""
from composer_jax.config.env import (TASK_KINDS, EnvConfig, SandboxBackend,  # noqa: F401
                                     ShellMode, Split)
