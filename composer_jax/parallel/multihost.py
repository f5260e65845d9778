"""Multi-host initialisation: `jax.distributed.initialize` from flags or the environment.

Resolution order for each field: explicit argument (launch.py flag) > COMPOSER_JAX_* environment
variable > the cluster's own variables (SLURM_*; on TPU pods and SLURM JAX auto-detects, so all
three may be left unset). A single process (no coordinator, one process) is a no-op.

Each host then loads only its share of the data: `host_batch_slice(global_batch)` gives the rows
of the global batch that this process feeds (global batch split evenly over processes).
"""
from __future__ import annotations

import os

from composer_jax.errors import ConfigError


def _env_int(name: str) -> int | None:
    v = os.environ.get(name)
    return int(v) if v not in (None, "") else None


def initialize(coordinator: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, local_device_ids: str | None = None) -> bool:
    """Starts jax.distributed when this is one process of several; returns True if it did."""
    import jax
    coordinator = coordinator or os.environ.get("COMPOSER_JAX_COORDINATOR") or None
    num_processes = num_processes or _env_int("COMPOSER_JAX_NUM_PROCESSES") or _env_int(
        "SLURM_NTASKS")
    if process_id is None:
        process_id = _env_int("COMPOSER_JAX_PROCESS_ID")
        if process_id is None:
            process_id = _env_int("SLURM_PROCID")
    auto = os.environ.get("TPU_WORKER_HOSTNAMES") or os.environ.get("SLURM_JOB_ID")
    if not coordinator and not auto and (num_processes or 1) == 1:
        return False
    if coordinator and (num_processes is None or process_id is None):
        raise ConfigError(f"multi-host: coordinator {coordinator!r} given but num_processes="
                          f"{num_processes} / process_id={process_id} unknown (set the flags or "
                          f"COMPOSER_JAX_NUM_PROCESSES / COMPOSER_JAX_PROCESS_ID)")
    ids = [int(i) for i in local_device_ids.split(",")] if local_device_ids else None
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                               process_id=process_id, local_device_ids=ids)
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
