"""Security tests: every escape attempt is blocked or contained and the host is unaffected."""
import os
import pathlib
import socket
import threading
import time

import pytest

from composer_jax.env import open_workspace
from composer_jax.env.config import ShellMode

from env_helpers import needs_bwrap

pytestmark = needs_bwrap


@pytest.fixture(params=[ShellMode.FRESH, ShellMode.PERSISTENT])
def ws(request, sample_dir, cfg):
    import dataclasses
    c = dataclasses.replace(cfg, shell_mode=request.param, command_timeout_s=5.0,
                            memory_limit_mb=256, max_processes=32, max_output_bytes=4096)
    with open_workspace(sample_dir, c) as w:
        yield w


def sh(ws, cmd, **kw):
    return ws.call("run_terminal_cmd", {"command": cmd, **kw}).output


@pytest.fixture
def secret(tmp_path):
    p = tmp_path / "host_secret.txt"
    p.write_text("TOP-SECRET")
    p.chmod(0o644)
    return p


def test_tools_refuse_paths_outside(ws, secret):
    for path in ("../../etc/passwd", str(secret), "/etc/passwd", "/workspace/../etc/passwd",
                 "pkg/../../x"):
        for tool, args in (("read_file", {"target_file": path}),
                           ("write_file", {"file_path": path, "contents": "x"}),
                           ("delete_file", {"target_file": path})):
            r = ws.call(tool, args)
            assert r.is_error, (tool, path, r.output)
    assert secret.read_text() == "TOP-SECRET"


def test_sandbox_cannot_see_host_files(ws, secret):
    out = sh(ws, f"cat {secret} 2>&1; ls {secret.parent} 2>&1; ls /root 2>&1; ls /home 2>&1")
    assert "TOP-SECRET" not in out and "No such file" in out


def test_symlink_planted_in_sandbox_does_not_leak_through_tools(ws, secret):
    sh(ws, f"ln -s {secret} leak.txt; ln -s / rootlink; ln -s /etc/passwd pw")
    for p in ("leak.txt", "rootlink/etc/passwd", "pw"):
        r = ws.call("read_file", {"target_file": p})
        assert r.is_error and "outside the workspace" in r.output, r.output
        assert ws.call("write_file", {"file_path": p, "contents": "pwned"}).is_error
    assert secret.read_text() == "TOP-SECRET"
    assert "TOP-SECRET" not in sh(ws, "cat leak.txt 2>&1")


def test_hardlink_to_outside_is_impossible(ws, secret):
    out = sh(ws, "ln /etc/passwd hl 2>&1; ln /usr/bin/env hl2 2>&1; echo done")
    assert out.count("ln: failed") == 2, out
    assert "Invalid cross-device link" in out
    assert not (ws.root / "hl").exists() and not (ws.root / "hl2").exists()


def test_system_is_read_only(ws):
    out = sh(ws, "touch /usr/x 2>&1; echo hi > /etc/x 2>&1; rm -f /usr/bin/env 2>&1; echo ok")
    assert out.count("Read-only file system") + out.count("Permission denied") >= 3, out
    assert os.path.exists("/usr/bin/env")


def test_proc_tricks(ws, secret):
    out = sh(ws, "ls /proc | grep -c '^[0-9]'; cat /proc/1/environ 2>&1 | head -c 200; "
                 f"ls /proc/1/root/ 2>&1 | head -5; cat /proc/1/root{secret} 2>&1")
    assert "TOP-SECRET" not in out
    n_procs = int(out.splitlines()[0])
    assert n_procs < 10  # its own pid namespace: only the sandbox's processes


def test_no_network_even_loopback(ws):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    got = []
    srv.settimeout(4)

    def accept():
        try:
            got.append(srv.accept())
        except OSError:
            pass
    t = threading.Thread(target=accept)
    t.start()
    out = sh(ws, f"python -c \"import socket; s=socket.socket(); s.settimeout(2); "
                 f"s.connect(('127.0.0.1', {port})); print('CONNECTED')\" 2>&1 | tail -1; "
                 "python -c \"import socket; socket.create_connection(('1.1.1.1', 80), timeout=2)\" "
                 "2>&1 | tail -1")
    t.join()
    srv.close()
    assert "CONNECTED" not in out and not got
    assert "refused" in out.lower() or "unreachable" in out.lower()


def test_fork_bomb_is_contained(ws):
    start = time.monotonic()
    out = sh(ws, "bomb() { bomb | bomb & }; bomb; sleep 2; echo survived", timeout=4)
    assert time.monotonic() - start < 15
    assert "alive" in sh(ws, "echo alive")  # the workspace still works afterwards
    assert "exit code" in out


def test_memory_bomb_is_contained(ws):
    out = sh(ws, "python -c \"x = bytearray(1 << 30); print('ALLOCATED')\" 2>&1 | tail -1")
    assert "MemoryError" in out and "ALLOCATED" not in out
    out = sh(ws, "head -c 400000000 /dev/zero > /tmp/big 2>&1; echo rc=$?")
    assert "rc=0" not in out  # /tmp is a small tmpfs; the file size limit stops it


def test_endless_output_is_capped(ws):
    start = time.monotonic()
    out = sh(ws, "yes y")
    assert time.monotonic() - start < 5
    assert len(out) < 6000 and "truncated" in out and ("too much output" in out or "timed out" in out)


def test_sleep_past_time_limit_is_killed(ws):
    start = time.monotonic()
    out = sh(ws, "sleep 60; echo NOPE", timeout=1)
    assert time.monotonic() - start < 4 and "timed out" in out and "NOPE" not in out


def _uid_procs(uid):
    n = 0
    for d in pathlib.Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if d.stat().st_uid == uid:
                    n += 1
            except FileNotFoundError:
                pass
    return n


def test_background_processes_do_not_outlive_the_command_or_episode(sample_dir, cfg):
    with open_workspace(sample_dir, cfg) as ws:
        uid = ws.uid
        ws.call("run_terminal_cmd", {"command": "(sleep 300 &) ; nohup sleep 301 >/dev/null 2>&1 & "
                                                "setsid sleep 302 & echo started"})
        time.sleep(0.3)
        if uid is not None:
            assert _uid_procs(uid) == 0  # gone with the command's pid namespace
        ws.call("run_terminal_cmd", {"command": "sleep 303", "is_background": True})
        time.sleep(0.3)
        if uid is not None:
            assert _uid_procs(uid) >= 1
    time.sleep(0.3)
    if uid is not None:
        assert _uid_procs(uid) == 0
