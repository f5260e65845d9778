"""env_doctor: what the coding environment can do on this machine, and a one-task smoke test.

`diagnose(cfg, workdir)` reports the sandbox backend (requested and effective, with why bubblewrap
is unusable when it is), which Linux namespaces an unprivileged process can create, the CPythons
found (and whether the sandbox can run each configured one), then generates a one-task pool in
WORKDIR/doctor/pool and runs the oracle and null agents on it (a sound environment: oracle
resolved, null not). No JAX is imported.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import subprocess
import time

from composer_jax.env.check import check_pool
from composer_jax.env.config import EnvConfig, SandboxBackend
from composer_jax.env.pythons import find_pythons
from composer_jax.env.sandbox import bwrap_error, sandbox_python
from composer_jax.env.tasks.generate import GenerationError, generate_pool
from composer_jax.env.trust import effective_backend

# `unshare` flags per namespace kind; each probe also unshares the user namespace when not root.
NAMESPACES = {"user": [], "mount": ["--mount"], "pid": ["--pid", "--fork"], "net": ["--net"],
              "ipc": ["--ipc"]}


def bwrap_status() -> dict:
    """bubblewrap's path, whether it works, and its error when it does not."""
    error = bwrap_error()
    return {"path": shutil.which("bwrap"), "works": not error, "error": error}


def namespaces() -> dict:
    """Which namespaces this process can create (probed with util-linux `unshare`)."""
    exe = shutil.which("unshare")
    if not exe:
        return {"probe": "`unshare` is not on PATH: not probed"}
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    out = {}
    for kind, flags in NAMESPACES.items():
        ns = ["--user", "--map-root-user"] if kind == "user" else user + flags
        argv = [exe] + ns + ["true"]
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=20)
            out[kind] = "yes" if r.returncode == 0 else "no: " + r.stderr.strip()[-120:]
        except (OSError, subprocess.TimeoutExpired) as e:
            out[kind] = f"no: {e}"
    for knob in ("/proc/sys/kernel/unprivileged_userns_clone", "/proc/sys/user/max_user_namespaces",
                 "/proc/sys/kernel/apparmor_restrict_unprivileged_userns"):
        if os.path.exists(knob):
            out[knob] = pathlib.Path(knob).read_text().strip()
    return out


def interpreters(cfg: EnvConfig, backend: SandboxBackend) -> dict:
    """The CPythons found, and for each configured version how the sandbox runs it."""
    found = find_pythons()
    out = {"found": {v: p.prefix for v, p in sorted(found.items())}, "configured": {}}
    for v in cfg.python_versions:
        if v not in found:
            out["configured"][v] = "MISSING (set CJ_PYTHON_PREFIXES, or drop it from " \
                                   "env.python_versions)"
            continue
        try:
            seen = sandbox_python(found[v], backend)
        except Exception as e:  # noqa: BLE001  (reported, not raised: this is a diagnosis)
            out["configured"][v] = f"UNUSABLE in the sandbox: {e}"
            continue
        out["configured"][v] = ("ok" if seen.prefix == found[v].prefix else
                                f"ok through a world-readable mirror {seen.prefix} (the sandbox "
                                f"uid cannot reach {found[v].prefix})")
    return out


def smoke_test(cfg: EnvConfig, workdir: pathlib.Path, play) -> dict:
    """Generates one task afresh in WORKDIR/doctor/pool and runs the oracle and null agents on it
    through `play` (the episode loop; their env_check.json goes to WORKDIR/doctor)."""
    workdir = pathlib.Path(workdir) / "doctor"
    pool = workdir / "pool"
    shutil.rmtree(pool, ignore_errors=True)  # a smoke test of generation too: never reuse
    start = time.monotonic()
    try:
        gen = generate_pool(cfg, pool, progress=False)
    except GenerationError as e:
        return {"ok": False, "error": str(e), "seconds": time.monotonic() - start}
    check = check_pool(cfg, pool, workdir, play=play, progress=False, limit=1)
    ok = check["oracle_resolved_rate"] == 1.0 and check["null_resolved_rate"] == 0.0
    return {"ok": ok, "task": check["kinds"], "python": check["versions"],
            "generate_seconds": gen["seconds"], "oracle_resolved": check["oracle_resolved_rate"],
            "null_resolved": check["null_resolved_rate"], "seconds": time.monotonic() - start}


def smoke_config(cfg: EnvConfig) -> EnvConfig:
    """One bug task from one small stdlib module of the newest configured CPython (env.modules
    when set)."""
    newest = max(cfg.python_versions, key=lambda v: tuple(map(int, v.split("."))))
    return dataclasses.replace(cfg, python_versions=(newest,), num_tasks=1,
                               max_tasks_per_module=1, kinds=("bug",), workers=1,
                               modules=cfg.modules or ("graphlib", "fnmatch", "getopt"),
                               package_sources=(), use_embeddings=False, pool_dir="")


def diagnose(cfg: EnvConfig, workdir: pathlib.Path, play) -> dict:
    """The whole report (module docstring); `play` runs an episode (`check.check_pool`)."""
    backend = effective_backend(cfg)
    report = {"requested_backend": cfg.sandbox_backend.value, "backend": backend.value,
              "bwrap": bwrap_status(), "running_as_root": os.geteuid() == 0,
              "namespaces": namespaces(), "interpreters": interpreters(cfg, backend)}
    if backend == SandboxBackend.FALLBACK:
        report["fallback_does_not_protect"] = [
            "the host filesystem (absolute paths are readable, and writable where the command's "
            "uid may write)", "the network (127.0.0.1 included)",
            "processes that leave their session (setsid)",
            "the task's reference files installed in the CPython (cannot be hidden)"]
        report["rl_training"] = ("refused on environment rewards unless "
                                 "env.allow_unsandboxed_rewards=true")
    report["smoke_test"] = smoke_test(smoke_config(cfg), workdir, play)
    return report
