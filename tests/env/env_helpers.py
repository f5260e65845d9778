"""Shared helpers for the environment tests."""
import pytest

from composer_jax.env.sandbox import bwrap_works

needs_bwrap = pytest.mark.skipif(not bwrap_works(), reason="bubblewrap is not usable here")


def needs_bwrap_now():
    """Skips the calling test (or fixture) when bubblewrap is not usable."""
    if not bwrap_works():
        pytest.skip("bubblewrap is not usable here")
