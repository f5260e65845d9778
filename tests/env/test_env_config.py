import dataclasses
import subprocess
import sys

import pytest

from composer_jax.env.config import EnvConfig, SandboxBackend, ShellMode
from composer_jax.errors import ConfigError


def test_defaults_are_valid_and_frozen():
    cfg = EnvConfig()
    assert cfg.sandbox_backend == SandboxBackend.AUTO and cfg.shell_mode == ShellMode.FRESH
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.num_tasks = 3  # type: ignore[misc]


@pytest.mark.parametrize("field,value,needle", [
    ("num_tasks", 0, "env.num_tasks"),
    ("command_timeout_s", -1.0, "env.command_timeout_s"),
    ("python_versions", ("3.x",), "env.python_versions"),
    ("python_versions", (), "env.python_versions"),
    ("kinds", ("bug", "nope"), "env.kinds"),
    ("sandbox_backend", "docker", "env.sandbox_backend"),
    ("reward_partial_credit", 1.5, "env.reward_partial_credit"),
    ("extra_ro_binds", ("relative/path",), "env.extra_ro_binds"),
])
def test_invalid_values_name_the_field(field, value, needle):
    with pytest.raises(ConfigError, match=needle):
        EnvConfig(**{field: value})


def test_field_types_are_plain():
    import typing
    hints = typing.get_type_hints(EnvConfig)
    for f in dataclasses.fields(EnvConfig):
        t = hints[f.name]
        ok = t in (int, float, str, bool) or typing.get_origin(t) is tuple or (
            isinstance(t, type) and issubclass(t, str))
        assert ok, (f.name, t)


def test_importing_env_does_not_import_jax():
    code = ("import sys, tempfile, pathlib\n"
            "import composer_jax.env\n"
            "from composer_jax.env.tools.semantic import bm25_scores, python_chunks\n"
            "print(bm25_scores(python_chunks('a.py', 'def f():\\n    return 1\\n'), 'f'))\n"
            "assert 'jax' not in sys.modules, 'jax was imported'\n"
            "assert 'torch' not in sys.modules\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
