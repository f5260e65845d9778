"""Sandboxed command execution over one workspace directory, without Docker.

Backend "bwrap" (bubblewrap): every command runs in fresh namespaces (pid, net, ipc, uts, cgroup),
with the host system mounted read-only (/usr, the CPython installs, our helper scripts), a private
/tmp of bounded size, a fresh /proc, minimal /dev, and only the workspace writable at /workspace.
The new network namespace has no interface but its own loopback, so nothing on the host
(127.0.0.1 included) or beyond is reachable. Killing the sandbox's outer process kills its pid
namespace (--die-with-parent), so nothing outlives a command or an episode (a SIGKILL landing
before bwrap has armed it leaves the inner bwrap running; `Sandbox.run` and the persistent shell
then kill whatever still holds the command's output: `procio.drain`'s `leader`). A sandbox killed
from outside raises `SandboxKilled` in `Workspace.run_command` (the episode resumes from its last
completed turn).

When we run as root, bubblewrap runs privileged and the command drops to a dedicated unprivileged
uid/gid (one per workspace) with no capabilities and no_new_privs via `setpriv`; that makes the
per-uid process limit (RLIMIT_NPROC) real and contains fork bombs. Other limits are rlimits set by
`ulimit` before the command: address space, file size, open files, no core dumps; wall time and
output size are enforced from outside (composer_jax.env.procio).

Backend "fallback" (no bubblewrap, e.g. Colab) runs the command directly in a scratch copy with the
same rlimits and a process group, and warns loudly: it does NOT isolate the filesystem (absolute
paths reach the host), the network, or processes that leave their session. As root it still drops
to the dedicated uid; that uid cannot traverse private directories such as /root, so an
interpreter installed there (pyenv's /root/.pyenv) is used through `sandbox_python`: a hard-linked
(else copied), world-readable mirror of its install prefix, made once per process.
"""
from __future__ import annotations

import atexit
import base64
import dataclasses
import functools
import os
import pathlib
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings

from composer_jax.env.config import EnvConfig, SandboxBackend
from composer_jax.env.pythons import PythonInstall
from composer_jax.env.procio import ProcResult, close_process, drain, kill_group, run_process
from composer_jax.errors import ComposerError

ASSETS_DIR = pathlib.Path(__file__).resolve().parent / "assets"
SANDBOX_WORKSPACE = "/workspace"
SANDBOX_ASSETS = "/opt/cj"
FALLBACK_WARNING = (
    "commands run WITHOUT A SANDBOX. "
    "Only rlimits, a scratch copy of the workspace and process-group kills protect the host: "
    "absolute paths, the network (127.0.0.1 included) and processes that call setsid are NOT "
    "contained. Install the Debian package `bubblewrap` for real isolation (check a machine with "
    "`python launch.py --experiment=env_doctor`).")


class SandboxError(ComposerError):
    """The sandbox could not be set up (e.g. bwrap requested but missing)."""


class SandboxKilled(SandboxError):
    """The sandbox of a command was killed from outside (its bubblewrap process got SIGKILL: an
    operator, the OOM killer of the host, a chaos run), not by the command or by our limits. Not a
    result to show the agent: the episode is interrupted (it can resume from its last completed
    turn, `agent.episode_checkpoint`)."""


def killed_from_outside(result: ProcResult, backend: SandboxBackend) -> bool:
    """True if `result` is a bubblewrap sandbox killed by SIGKILL from outside. Inside, a command
    killed by any signal (itself, `kill -9 -1`, rlimits) makes bwrap exit with 128 + signal, and
    our own kills (timeout, output flood) are flagged; only a SIGKILL of the bwrap process itself
    makes the exit status -SIGKILL. The fallback backend cannot tell (its command is the process),
    so it never says so."""
    return (backend == SandboxBackend.BWRAP and result.exit_code == -signal.SIGKILL
            and not result.timed_out and not result.killed_for_output)


@dataclasses.dataclass(frozen=True)
class Limits:
    """Per-command resource limits."""
    timeout_s: float = 30.0
    memory_mb: int = 2048
    max_processes: int = 64
    max_file_size_mb: int = 64
    max_open_files: int = 256
    max_output_bytes: int = 16384
    tmp_size_mb: int = 256

    @classmethod
    def from_config(cls, cfg: EnvConfig) -> "Limits":
        return cls(timeout_s=cfg.command_timeout_s, memory_mb=cfg.memory_limit_mb,
                   max_processes=cfg.max_processes, max_file_size_mb=cfg.max_file_size_mb,
                   max_open_files=cfg.max_open_files, max_output_bytes=cfg.max_output_bytes)

    def ulimit_prefix(self) -> str:
        """Shell line setting soft and hard rlimits (so the command cannot raise them)."""
        return (f"ulimit -S -H -v {self.memory_mb * 1024} -f {self.max_file_size_mb * 1024} "
                f"-n {self.max_open_files} -c 0 -u {self.max_processes} || exit 125")


@functools.lru_cache(maxsize=1)
def staged_assets() -> str:
    """A world-readable copy of the helper scripts (mounted at /opt/cj), removed at exit."""
    d = tempfile.mkdtemp(prefix="cj-assets-")
    os.chmod(d, 0o755)
    for f in ASSETS_DIR.iterdir():
        if f.is_file():
            shutil.copy(f, d)
            os.chmod(os.path.join(d, f.name), 0o644)
    atexit.register(shutil.rmtree, d, True)
    return d


def bwrap_error() -> str:
    """"" if `bwrap` exists and can create the namespaces we use on this machine, else why not."""
    exe = shutil.which("bwrap")
    if not exe:
        return "`bwrap` is not on PATH"
    try:
        r = subprocess.run([exe, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/",
                            "--proc", "/proc", "--dev", "/dev", "true"],
                           capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    return "" if r.returncode == 0 else (r.stderr.strip()[-300:] or f"exit {r.returncode}")


@functools.lru_cache(maxsize=1)
def bwrap_works() -> bool:
    """True if `bwrap` exists and can create the namespaces we use on this machine."""
    return not bwrap_error()


def resolve_backend(requested: SandboxBackend) -> SandboxBackend:
    """AUTO -> BWRAP when it works, else FALLBACK (with the loud warning)."""
    if requested == SandboxBackend.BWRAP:
        if not bwrap_works():
            raise SandboxError("env.sandbox_backend=bwrap but `bwrap` is missing or cannot create "
                               "namespaces here; install the Debian package `bubblewrap` or use "
                               "sandbox_backend=auto/fallback")
        return SandboxBackend.BWRAP
    if requested == SandboxBackend.AUTO and bwrap_works():
        return SandboxBackend.BWRAP
    why = ("env.sandbox_backend=fallback" if requested == SandboxBackend.FALLBACK else
           "bubblewrap (`bwrap`) is not available")
    message = f"composer_jax.env: {why}; {FALLBACK_WARNING}"
    warnings.warn(message, RuntimeWarning, stacklevel=2)
    print("WARNING: " + message, file=sys.stderr)
    return SandboxBackend.FALLBACK


def allocate_uid() -> int | None:
    """A fresh unprivileged uid for one workspace when running as root, else None (keep ours)."""
    if os.geteuid() != 0:
        return None
    return 200000 + secrets.randbelow(1_000_000)


def reap_uid(uid: int | None, wait_s: float = 5.0) -> bool:
    """SIGKILLs every process `uid` owns on this host and waits (at most `wait_s`) until it owns
    none; True when none is left (always for None). For a uid that owns one run only (a graded
    run's): a SIGKILL lands asynchronously, through a pid namespace's teardown, and until it does
    the run's processes still use CPU and count as runnable, so whatever is judged next about the
    machine's load would include them."""
    if uid is None:
        return True
    deadline = time.monotonic() + wait_s
    while True:
        try:
            alive = subprocess.run(["pkill", "-KILL", "-U", str(uid)], check=False,
                                   stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL).returncode == 0
        except OSError:
            return False
        if not alive:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)


def uid_can_run(uid: int, py: PythonInstall) -> bool:
    """True if `uid` (no groups, no capabilities) can start `py` with its own stdlib. (An
    interpreter whose prefix the uid cannot read may still start, with another
    Python's stdlib found by its search: that counts as False.)"""
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    if py.prefix in _MIRRORS:
        env["LD_LIBRARY_PATH"] = _MIRRORS[py.prefix]
    code = "import os, sys; sys.stdout.write(os.path.dirname(os.__file__))"
    try:
        r = subprocess.run(["/usr/bin/setpriv", f"--reuid={uid}", f"--regid={uid}",
                            "--clear-groups", "--", py.executable, "-I", "-S", "-B", "-c", code],
                           env=env, cwd="/", capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and os.path.realpath(r.stdout) == os.path.realpath(py.stdlib)


_MIRRORS: dict[str, str] = {}   # mirror prefix -> its lib dir (LD_LIBRARY_PATH for libpython)
_MIRROR_LOCK = threading.Lock()


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem (or links refused): a plain copy
        shutil.copy2(src, dst)


@functools.lru_cache(maxsize=None)
def _mirror(prefix: str) -> str:
    """A world-readable mirror of the install `prefix` (hard links where possible), removed at
    exit."""
    d = tempfile.mkdtemp(prefix="cj-python-")
    os.chmod(d, 0o755)
    atexit.register(shutil.rmtree, d, True)
    dst = os.path.join(d, pathlib.Path(prefix).name)
    shutil.copytree(prefix, dst, symlinks=True, copy_function=_link_or_copy)
    _MIRRORS[dst] = dst + "/lib"
    return dst


def sandbox_python(py: PythonInstall, backend: SandboxBackend) -> PythonInstall:
    """`py` as the sandbox's commands reach it. Only the fallback run as root changes anything:
    its commands run as an unprivileged uid, which cannot reach an install below a private
    directory (pyenv's /root/.pyenv); that install is then used through a world-readable mirror
    of its prefix (`_mirror`). SandboxError if even the mirror is unusable."""
    if backend != SandboxBackend.FALLBACK or os.geteuid() != 0:
        return py
    with _MIRROR_LOCK:
        return _reachable_python(py)


@functools.lru_cache(maxsize=None)
def _reachable_python(py: PythonInstall) -> PythonInstall:
    probe_uid = 1_200_001  # above allocate_uid's range: owns nothing
    if py.prefix in _MIRRORS or uid_can_run(probe_uid, py):
        return py
    prefix = _mirror(py.prefix)
    rel = lambda p: prefix + p[len(py.prefix):]  # noqa: E731
    mirrored = PythonInstall(py.version, py.full_version, prefix, rel(py.executable),
                             rel(py.stdlib))
    if not uid_can_run(probe_uid, mirrored):
        raise SandboxError(
            f"env.sandbox_backend=fallback runs commands as an unprivileged uid, which can run "
            f"neither CPython {py.version} at {py.executable} nor its mirror "
            f"{mirrored.executable}; install that CPython where every user can read it (e.g. "
            f"under /opt) and list its prefix in CJ_PYTHON_PREFIXES, or install bubblewrap")
    return mirrored


def _system_binds() -> list[str]:
    """Read-only binds of the host system: /usr (and the usual /bin, /lib symlinks) and a few /etc files."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        p = pathlib.Path("/" + name)
        if p.is_symlink():
            args += ["--symlink", os.readlink(p), str(p)]
        elif p.is_dir():
            args += ["--ro-bind", str(p), str(p)]
    args += ["--perms", "0755", "--dir", "/etc"]
    for f in ("/etc/ld.so.cache", "/etc/localtime", "/etc/alternatives", "/etc/nsswitch.conf"):
        if os.path.exists(f):
            args += ["--ro-bind", f, f]
    return args


class Sandbox:
    """Runs shell commands over `workspace_dir` (writable) with the given limits.

    `python_prefixes` are CPython install prefixes mounted read-only at their own paths; the first
    one's `bin` leads PATH (so `python` is the task's interpreter). `overlays` are (host file,
    sandbox path) read-only binds laid over the mounted system (`composer_jax.env.hide`: they hide
    a task's reference files; bubblewrap only). Background jobs started with `spawn` live until
    `close()`.
    """

    def __init__(self, workspace_dir: pathlib.Path, *, backend: SandboxBackend, limits: Limits,
                 python_prefixes: tuple[str, ...] = (), extra_ro_binds: tuple[str, ...] = (),
                 uid: int | None = None, overlays: tuple[tuple[str, str], ...] = ()):
        self.host_dir = pathlib.Path(workspace_dir).resolve()
        self.backend = backend
        self.limits = limits
        self.python_prefixes = tuple(python_prefixes)
        self.extra_ro_binds = tuple(extra_ro_binds)
        self.uid = uid
        self.overlays = tuple(overlays)
        self._jobs: list[subprocess.Popen] = []
        isolated = backend == SandboxBackend.BWRAP
        self.workdir = SANDBOX_WORKSPACE if isolated else str(self.host_dir)
        self.assets = SANDBOX_ASSETS if isolated else staged_assets()
        self._home = self.host_dir.parent / (self.host_dir.name + ".home")
        if not isolated:
            self._home.mkdir(exist_ok=True)
            if uid is not None:
                os.chown(self._home, uid, uid)

    # -- argv ---------------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """The environment commands see (nothing inherited from the host)."""
        bins = [p + "/bin" for p in self.python_prefixes[:1]]
        home = "/tmp" if self.backend == SandboxBackend.BWRAP else str(self._home)
        env = {"PATH": ":".join(bins + ["/usr/local/bin", "/usr/bin", "/bin"]), "HOME": home,
               "TMPDIR": home, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TERM": "dumb",
               "PAGER": "cat", "GIT_PAGER": "cat", "PYTHONDONTWRITEBYTECODE": "1",
               "PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "1"}
        libs = [_MIRRORS[p] for p in self.python_prefixes[:1] if p in _MIRRORS]
        if libs:  # a mirrored interpreter whose RUNPATH names the unreachable original
            env["LD_LIBRARY_PATH"] = libs[0]
        return env

    def _bwrap_prefix(self) -> list[str]:
        args = ["bwrap", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
                "--unshare-cgroup-try", "--die-with-parent", "--new-session",
                "--hostname", "sandbox"]
        if os.geteuid() != 0:
            args.insert(1, "--unshare-user")
        args += _system_binds()
        made: set[str] = set()
        for prefix in self.python_prefixes + self.extra_ro_binds:
            for parent in reversed(pathlib.PurePosixPath(prefix).parents):
                if str(parent) not in made and str(parent) not in ("/", "/usr"):
                    made.add(str(parent))  # bwrap would create missing parents with mode 0700
                    args += ["--perms", "0755", "--dir", str(parent)]
            args += ["--ro-bind", prefix, prefix]
        for src, dst in self.overlays:
            args += ["--ro-bind", src, dst]
        args += ["--perms", "0755", "--dir", "/opt", "--ro-bind", staged_assets(), SANDBOX_ASSETS,
                 "--bind", str(self.host_dir), SANDBOX_WORKSPACE,
                 "--perms", "1777", "--size", str(self.limits.tmp_size_mb << 20), "--tmpfs", "/tmp",
                 "--proc", "/proc", "--dev", "/dev", "--chdir", SANDBOX_WORKSPACE, "--"]
        return args

    def _drop_privileges(self) -> list[str]:
        if self.uid is None:
            return []
        return ["/usr/bin/setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups",
                "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]

    def argv(self, script: str) -> list[str]:
        """The argv running bash `script` (after the ulimit line and a cd) in the sandbox."""
        full = f"{self.limits.ulimit_prefix()}\ncd {self.workdir} || exit 125\n{script}"
        tail = self._drop_privileges() + ["/bin/bash", "--noprofile", "--norc", "-c", full]
        if self.backend == SandboxBackend.BWRAP:
            return self._bwrap_prefix() + tail
        return tail

    # -- running --------------------------------------------------------------------------------
    def run(self, command: str, *, timeout_s: float | None = None,
            max_output_bytes: int | None = None, stdin_data: bytes | None = None) -> ProcResult:
        """Runs `command` in a fresh sandboxed bash; every process it started dies with it.
        `stdin_data` is the command's whole stdin (default: none)."""
        return run_process(self.argv(command), env=self.env(),
                           timeout_s=timeout_s or self.limits.timeout_s,
                           max_output_bytes=max_output_bytes or self.limits.max_output_bytes,
                           cwd=str(self.host_dir), stdin_data=stdin_data,
                           output_dies_with_leader=self.backend == SandboxBackend.BWRAP)

    def spawn(self, command: str) -> int:
        """Starts `command` in the background (output discarded); returns its job number."""
        proc = subprocess.Popen(self.argv(command), env=self.env(), cwd=str(self.host_dir),
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
        self._jobs.append(proc)
        return len(self._jobs)

    def close(self) -> None:
        """Kills every background job (and, via their pid namespaces, all their processes)."""
        for proc in self._jobs:
            kill_group(proc)
            proc.wait()
        self._jobs.clear()
        if self.backend != SandboxBackend.BWRAP:
            # The dedicated uid owns nothing else on the host: kill whatever it left behind.
            reap_uid(self.uid, wait_s=0.0)
        if self._home.exists():
            shutil.rmtree(self._home, ignore_errors=True)


@dataclasses.dataclass(frozen=True)
class RunningSandbox:
    """A running bubblewrap sandbox (its outer bwrap process): `workspace` is the host directory
    mounted at /workspace, `script` the bash script it runs (the command after the ulimit line)."""
    pid: int
    workspace: str
    script: str


def _proc_parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def running_sandboxes(under: tuple[int, ...] = ()) -> list[RunningSandbox]:
    """The bubblewrap sandboxes running now (from /proc), each by its outer bwrap process, whose
    SIGKILL kills the whole sandbox (--die-with-parent); with `under`, only those descending from
    one of these pids (e.g. a run's rollout workers). Linux only; [] where /proc has none."""
    out = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
            if not argv or os.path.basename(argv[0]) != b"bwrap":
                continue
            pid, chain = int(entry.name), []
            parent = _proc_parent(pid)
            if (pathlib.Path(f"/proc/{parent}/comm").read_text().strip() == "bwrap"):
                continue                               # the inner bwrap of a pid namespace
            while parent > 1 and under:
                chain.append(parent)
                parent = _proc_parent(parent)
        except (OSError, ValueError, IndexError):     # exited meanwhile
            continue
        if under and not set(chain) & set(under):
            continue
        args = [a.decode(errors="replace") for a in argv]
        ws = next((args[i - 1] for i in range(2, len(args))
                   if args[i] == SANDBOX_WORKSPACE and args[i - 2] == "--bind"), "")
        out.append(RunningSandbox(pid, ws, args[-1].split("\n", 2)[-1]))
    return out


class PersistentShell:
    """One long-lived sandboxed bash per episode: cwd and variables persist between commands.

    Each command runs in the shell itself; afterwards every other process in the sandbox is killed
    (`kill -9 -1` inside the pid namespace or dedicated uid), so nothing outlives a command. A
    timeout, an output flood or an `exit` kills the shell; the next command starts a new one and
    says so.
    """

    def __init__(self, sandbox: Sandbox):
        self.sandbox = sandbox
        self._proc: subprocess.Popen | None = None
        self._restarted_note = ""
        self._can_kill_all = sandbox.backend == SandboxBackend.BWRAP or sandbox.uid is not None

    def _start(self) -> subprocess.Popen:
        return subprocess.Popen(self.sandbox.argv("exec /bin/bash --noprofile --norc"),
                                env=self.sandbox.env(), cwd=str(self.sandbox.host_dir),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)

    def run(self, command: str, *, timeout_s: float | None = None) -> ProcResult:
        """Runs `command` in the persistent shell; the result is shaped like Sandbox.run's."""
        limits = self.sandbox.limits
        timeout_s = timeout_s or limits.timeout_s
        note = self._restarted_note
        self._restarted_note = ""
        if self._proc is None or self._proc.poll() is not None:
            self._proc = self._start()
        nonce = secrets.token_hex(8)
        marker = f"__CJ_DONE_{nonce}_"
        b64 = base64.b64encode(command.encode()).decode()
        kill_rest = "{ kill -9 -1; wait; } 2>/dev/null; " if self._can_kill_all else ""
        line = (f"__cj_c=$(printf %s '{b64}' | base64 -d); eval \"$__cj_c\" </dev/null 2>&1; "
                f"__cj_rc=$?; {kill_rest}printf '\\n{marker}%s\\n' \"$__cj_rc\"\n")
        start = time.monotonic()
        try:
            self._proc.stdin.write(line.encode())
            self._proc.stdin.flush()
        except BrokenPipeError:
            pass
        kept, total, why, tail = drain(self._proc.stdout.fileno(), start + timeout_s,
                                       limits.max_output_bytes,
                                       kill_after_bytes=max(8 * limits.max_output_bytes, 1 << 20),
                                       stop_marker=marker.encode(),
                                       leader=self._proc if self.sandbox.backend ==
                                       SandboxBackend.BWRAP else None)
        cut = kept.find(("\n" + marker).encode())
        if cut >= 0:
            kept = kept[:cut]
        code = 0
        if why == "marker":
            try:
                code = int(tail.decode().strip()[len(marker):])
            except ValueError:
                code = -1
        else:
            if why == "eof":       # the shell ended: by `exit` (its status), or killed from outside
                try:
                    code = 1 if self._proc.wait(timeout=5) != -signal.SIGKILL else -signal.SIGKILL
                except subprocess.TimeoutExpired:
                    code = 1
            else:
                code = -9
            self.close()
            self._restarted_note = ("[the shell was restarted: working directory and variables "
                                    "were reset]\n")
        text = note + kept.decode("utf-8", errors="replace")
        if why == "eof":
            text += "\n[the shell exited]"
        return ProcResult(exit_code=code, output=text, timed_out=why == "timeout",
                          truncated=len(kept) >= limits.max_output_bytes, output_bytes=total,
                          killed_for_output=why == "overflow", duration_s=time.monotonic() - start)

    def close(self) -> None:
        """Kills the shell and everything in its sandbox."""
        if self._proc is not None:
            close_process(self._proc)
            self._proc = None
