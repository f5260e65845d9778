import dataclasses
import pathlib
import warnings

import pytest

from composer_jax.env import open_workspace
from composer_jax.env.config import SandboxBackend, ShellMode
from composer_jax.env.procio import run_process
from composer_jax.env.sandbox import FALLBACK_WARNING, resolve_backend

from env_helpers import needs_bwrap


@needs_bwrap
def test_fresh_shell_keeps_no_state(sample_dir, cfg):
    with open_workspace(sample_dir, cfg) as ws:
        assert ws.run_command("cd pkg; export X=1; pwd").output == "/workspace/pkg\n"
        assert ws.run_command("pwd; echo ${X:-unset}").output == "/workspace\nunset\n"


@needs_bwrap
def test_persistent_shell_keeps_cwd_and_variables_and_restarts(sample_dir, cfg):
    c = dataclasses.replace(cfg, shell_mode=ShellMode.PERSISTENT)
    with open_workspace(sample_dir, c) as ws:
        assert ws.run_command("cd pkg; export X=1").exit_code == 0
        r = ws.run_command("pwd; echo $X; false")
        assert r.output == "/workspace/pkg\n1\n" and r.exit_code == 1
        r = ws.run_command("sleep 5", timeout_s=0.5)
        assert r.timed_out
        r = ws.run_command("pwd")
        assert r.output.endswith("/workspace\n") and "restarted" in r.output
        r = ws.run_command("exit 4")
        assert "shell exited" in r.output
        assert ws.run_command("echo back").output.endswith("back\n")


@needs_bwrap
def test_workspace_python_is_the_requested_version(sample_dir, cfg):
    v = cfg.python_versions[0]
    with open_workspace(sample_dir, cfg, python_version=v) as ws:
        out = ws.run_command("python -c 'import sys; print(sys.version_info[:2])'").output
        assert out.strip() == str(tuple(map(int, v.split("."))))
        assert ws.run_command("python -m unittest -q test_mod 2>&1 | tail -1").output == "OK\n"


def test_run_process_caps_output_and_reports_timeouts(tmp_path):
    r = run_process(["bash", "-c", "yes | head -c 100000; echo; exit 7"], timeout_s=10,
                    max_output_bytes=1000, env={"PATH": "/usr/bin:/bin"})
    assert r.exit_code == 7 and len(r.output) == 1000 and r.truncated and r.output_bytes == 100001
    r = run_process(["sleep", "10"], timeout_s=0.3, max_output_bytes=100,
                    env={"PATH": "/usr/bin:/bin"})
    assert r.timed_out and r.duration_s < 3


def test_fallback_backend_warns_loudly(sample_dir, cfg, capsys):
    with pytest.warns(RuntimeWarning, match="WITHOUT A SANDBOX"):
        assert resolve_backend(SandboxBackend.FALLBACK) == SandboxBackend.FALLBACK
    assert "WITHOUT A SANDBOX" in capsys.readouterr().err
    c = dataclasses.replace(cfg, sandbox_backend=SandboxBackend.FALLBACK)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with open_workspace(sample_dir, c) as ws:
            r = ws.call("run_terminal_cmd", {"command": "echo hi > out.txt; cat out.txt; ulimit -v"})
            assert r.output.startswith("hi\n" + str(c.memory_limit_mb * 1024))
            assert (ws.root / "out.txt").exists()
    assert "network" in FALLBACK_WARNING and "absolute paths" in FALLBACK_WARNING
    assert pathlib.Path(sample_dir / "mod.py").exists()
