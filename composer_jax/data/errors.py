"""Errors of the data package (messages meant for users)."""

from composer_jax.errors import ComposerError


class DataError(ComposerError):
    """The corpus, tokenizer or pipeline input is unusable; the message says what and how to fix it."""
