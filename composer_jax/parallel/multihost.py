"""Multi-host initialisation: `jax.distributed.initialize` from flags, the environment, or JAX's own
cluster auto-detection.

Resolution order: explicit arguments (launch.py flags) > COMPOSER_JAX_* environment variables >
auto-detection. With no flags and no COMPOSER_JAX_* variables, `detect_cluster()` asks JAX's cluster
environments (TPU VM/pod slices through the metadata server or GKE variables, SLURM, Open MPI,
Kubernetes) whether this process is one of several; if it is, `jax.distributed.initialize()` is
called with no arguments and JAX fills in the coordinator, process count and id itself. A laptop,
a Colab runtime or a single-host TPU VM is a no-op (one process, nothing to initialise).

`COMPOSER_JAX_DISTRIBUTED=0` turns auto-detection off; `=1` forces `initialize()` (for a cluster
JAX detects that the check below cannot see).

Each host then loads only its share of the data: `host_batch_slice(global_batch)` gives the rows
of the global batch that this process feeds (global batch split evenly over processes).
"""
from __future__ import annotations

import dataclasses
import os

from composer_jax.errors import ConfigError


def _env_int(name: str) -> int | None:
    v = os.environ.get(name)
    return int(v) if v not in (None, "") else None


@dataclasses.dataclass(frozen=True)
class Cluster:
    """A detected multi-process environment: its JAX cluster name and process count."""
    name: str
    num_processes: int


def _jax_cluster_types() -> list:
    """JAX's registered cluster environments (jax._src.clusters, not a public API: an empty list if
    it moves, and detection falls back to the environment variables below)."""
    try:
        from jax._src import clusters
        return [c for c in clusters.ClusterEnv._cluster_types if not c.opt_in_only_method]
    except Exception:  # noqa: BLE001  (private API changed: fall back)
        return []


def _env_fallback() -> Cluster | None:
    """Multi-process launches visible from environment variables alone."""
    hosts = os.environ.get("TPU_WORKER_HOSTNAMES") or os.environ.get("TPU_PROCESS_ADDRESSES")
    if hosts and len(hosts.split(",")) > 1:
        return Cluster("tpu_env", len(hosts.split(",")))
    for name, var in (("slurm", "SLURM_NTASKS"), ("ompi", "OMPI_COMM_WORLD_SIZE")):
        n = _env_int(var)
        if n and n > 1:
            return Cluster(name, n)
    return None


def detect_cluster(cluster_types=None) -> Cluster | None:
    """The multi-process cluster this process belongs to, or None (single process).

    Uses the same checks as `jax.distributed.initialize()` (each cluster type's `is_env_present`,
    then its process count); a cluster of one process is None. `cluster_types` is for tests."""
    types = _jax_cluster_types() if cluster_types is None else cluster_types
    for env in types:
        try:
            if not env.is_env_present():
                continue
            n = int(env.get_process_count())
        except Exception:  # noqa: BLE001  (a half-configured environment: not this one)
            continue
        return Cluster(getattr(env, "name", "") or env.__name__, n) if n > 1 else None
    return _env_fallback()


def initialize(coordinator: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, local_device_ids: str | None = None,
               cluster_types=None) -> bool:
    """Starts jax.distributed when this is one process of several; returns True if it did."""
    import jax
    coordinator = coordinator or os.environ.get("COMPOSER_JAX_COORDINATOR") or None
    num_processes = num_processes or _env_int("COMPOSER_JAX_NUM_PROCESSES")
    if process_id is None:
        process_id = _env_int("COMPOSER_JAX_PROCESS_ID")
    ids = [int(i) for i in local_device_ids.split(",")] if local_device_ids else None
    if coordinator:
        if num_processes is None or process_id is None:
            raise ConfigError(f"multi-host: coordinator {coordinator!r} given but num_processes="
                              f"{num_processes} / process_id={process_id} unknown (set the flags or "
                              f"COMPOSER_JAX_NUM_PROCESSES / COMPOSER_JAX_PROCESS_ID)")
        jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                                   process_id=process_id, local_device_ids=ids)
        return True
    mode = os.environ.get("COMPOSER_JAX_DISTRIBUTED", "auto").lower()
    if mode in ("0", "false", "off", "no"):
        return False
    if mode not in ("1", "true", "on", "yes") and (num_processes or 1) == 1:
        if detect_cluster(cluster_types) is None:
            return False
    # Let JAX detect the coordinator, process count and id (TPU metadata, SLURM, MPI, k8s).
    jax.distributed.initialize(num_processes=num_processes, process_id=process_id,
                               local_device_ids=ids)
    return True


def host_batch_slice(global_batch: int) -> slice:
    """Rows of the global batch this process loads (contiguous, equal shares)."""
    import jax
    n, i = jax.process_count(), jax.process_index()
    if global_batch % n:
        raise ConfigError(f"data.global_batch_size={global_batch} must be divisible by the "
                          f"{n} processes")
    per = global_batch // n
    return slice(i * per, (i + 1) * per)
