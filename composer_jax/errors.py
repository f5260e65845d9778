"""Exception types with messages meant for users (no JAX import here)."""


class ComposerError(Exception):
    """Base class: every error composer_jax raises on purpose for bad input."""


class ConfigError(ComposerError, ValueError):
    """A config value, override or combination is invalid; the message says which and what is valid."""


class ExperimentError(ComposerError, KeyError):
    """An unknown experiment name; the message lists the registered ones."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain.
        return str(self.args[0]) if self.args else ""


class CheckpointError(ComposerError):
    """A checkpoint is missing, malformed or does not match the config."""
