"""Shared helpers for the environment tests."""
import pytest

from composer_jax.env.sandbox import bwrap_works

needs_bwrap = pytest.mark.skipif(not bwrap_works(), reason="bubblewrap is not usable here")
