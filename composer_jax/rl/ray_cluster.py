"""A multi-node Ray cluster on this machine, each node its own raylet: for the node-loss chaos
benchmark (`benchmarks/chaos_bench.py --ray_nodes N`) and the node-loss test.

    with LocalRayCluster() as cluster:
        cluster.start_head()                              # the driver's node
        node = cluster.add_node(resources={"inference": 1})
        cluster.address                                   # -> ray.init(address=...)
        cluster.kill_node(node)                           # SIGKILL its raylet and every process

Every node is one `ray start --block` in its own session, so a node's processes (raylet, agents,
workers, actors) are exactly that session's and killing them is one loss of that node. Ports are
chosen free, the temp dir is private, token authentication is on (Ray 2.60: RAY_AUTH_MODE=token
and a fresh RAY_AUTH_TOKEN, or `token`, for every node; a driver needs `token_env` in its
environment before it imports Ray, which reads it once), and node death is
detected within about `health_check_ms` x 3. `stop()` (also on exit and on errors) kills every
process of every session it started, and only those.
"""
from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from composer_jax.errors import ComposerError


class ClusterError(ComposerError, RuntimeError):
    """A node of the local cluster did not start (the message has its log's tail)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclasses.dataclass
class LocalNode:
    """One node: its `ray start --block` process (the session leader) and node-manager port."""
    name: str
    proc: subprocess.Popen
    node_manager_port: int
    resources: dict
    log: str
    killed_at: float = 0.0


class LocalRayCluster:
    """Local multi-node cluster (module docstring)."""

    def __init__(self, root: str = "", *, cpus_per_node: int = 1, object_store_mb: int = 200,
                 health_check_ms: int = 500, token: str = ""):
        self.root = root or tempfile.mkdtemp(prefix="cjr-", dir="/tmp")   # short socket paths
        self.cpus, self.store_bytes = cpus_per_node, object_store_mb << 20
        self.health_check_ms = health_check_ms
        self.token_env = {"RAY_AUTH_MODE": "token",
                          "RAY_AUTH_TOKEN": token or secrets.token_hex(32)}
        self.ray = os.path.join(os.path.dirname(sys.executable), "ray")
        self.nodes: list[LocalNode] = []
        self.head: LocalNode | None = None
        self.address = ""
        self._count = 0

    def __enter__(self) -> "LocalRayCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _start(self, args: list[str], resources: dict | None) -> LocalNode:
        self._count += 1
        name = f"node{self._count}"
        nm_port = _free_port()
        log = os.path.join(self.root, f"{name}.log")
        cmd = [self.ray, "start", "--block", f"--num-cpus={self.cpus}",
               f"--object-store-memory={self.store_bytes}", f"--temp-dir={self.root}",
               "--node-ip-address=127.0.0.1", "--disable-usage-stats",
               f"--node-manager-port={nm_port}", f"--object-manager-port={_free_port()}",
               f"--dashboard-agent-listen-port={_free_port()}",
               f"--dashboard-agent-grpc-port={_free_port()}",
               f"--runtime-env-agent-port={_free_port()}", f"--metrics-export-port={_free_port()}",
               "--include-log-monitor=false"] + args
        if resources:
            cmd.append(f"--resources={json.dumps(resources)}")
        env = dict(os.environ, **self.token_env)
        with open(log, "w") as out:
            proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        node = LocalNode(name, proc, nm_port, dict(resources or {}), log)
        self.nodes.append(node)
        return node

    def start_head(self, resources: dict | None = None, timeout: float = 120) -> LocalNode:
        port = _free_port()
        cfg = {"health_check_period_ms": self.health_check_ms,
               "health_check_timeout_ms": 2 * self.health_check_ms,
               "health_check_failure_threshold": 3}
        self.head = self._start(["--head", f"--port={port}", "--include-dashboard=false",
                                 f"--ray-client-server-port={_free_port()}",
                                 f"--system-config={json.dumps(cfg)}"], resources)
        self.address = f"127.0.0.1:{port}"
        self._wait_for(self.head, timeout)
        return self.head

    def add_node(self, resources: dict | None = None, timeout: float = 120) -> LocalNode:
        if not self.address:
            raise ClusterError("start_head() first")
        node = self._start([f"--address={self.address}"], resources)
        self._wait_for(node, timeout)
        return node

    def _wait_for(self, node: LocalNode, timeout: float) -> None:
        """Until the node's raylet listens on its node-manager port."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if node.proc.poll() is not None:
                break
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", node.node_manager_port)) == 0:
                    return
            time.sleep(0.2)
        tail = open(node.log, errors="replace").read()[-2000:]
        raise ClusterError(f"Ray node {node.name} did not start within {timeout:.0f}s "
                           f"(exit {node.proc.poll()}); its log ends:\n{tail}")

    def node_id(self, node: LocalNode) -> str | None:
        """The node's Ray NodeID (from a connected driver), None if Ray does not list it alive."""
        import ray
        for n in ray.nodes():
            if n.get("NodeManagerPort") == node.node_manager_port and n.get("Alive"):
                return n["NodeID"]
        return None

    def live_nodes(self) -> list[LocalNode]:
        return [n for n in self.nodes if not n.killed_at]

    @staticmethod
    def _session(node: LocalNode) -> list[int]:
        """Pids of every live process in the node's session (from /proc)."""
        out = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.getsid(int(entry)) == node.proc.pid:
                        out.append(int(entry))
                except (ProcessLookupError, PermissionError):
                    pass
        return out

    def kill_node(self, node: LocalNode) -> int:
        """SIGKILLs every process of the node (raylet first); returns how many."""
        pids = sorted(self._session(node), key=lambda pid: b"raylet" not in _cmdline(pid))
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            os.killpg(node.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        node.proc.wait(timeout=30)
        node.killed_at = time.time()
        return len(pids)

    def stop(self) -> None:
        """Kills every node this cluster started (head last) and removes its temp dir."""
        for node in sorted(self.nodes, key=lambda n: n is self.head):
            if node.proc.poll() is None or self._session(node):
                try:
                    self.kill_node(node)
                except Exception:  # noqa: BLE001 - best effort: the next node still goes
                    pass
        shutil.rmtree(self.root, ignore_errors=True)


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""
