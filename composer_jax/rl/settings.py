"""The RL driver's settings (from a Config's `rl` section: `settings_from_config`)."""
from __future__ import annotations

import dataclasses

from composer_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class DriverSettings:
    group_size: int = 4               # G
    batch_groups: int = 2             # B
    max_staleness: int = 2            # S (0 = synchronous)
    stale_policy: str = "drop"        # a group older than S at consumption: "drop" | "keep"
    steps: int = 10                   # trainer versions to reach
    checkpoint_every: int = 1
    eval_every: int = 0               # 0: no held-out evaluation
    num_workers: int = 4
    worker_mode: str = "thread"       # "thread" | "process" (local backend)
    backend: str = "local"            # "local" | "ray"
    ray_address: str = ""             # "" starts a local Ray cluster inside the run
    inference_resource: str = ""      # Ray: the inference actor only on nodes with this resource
    seed: int = 0
    progress: bool = True
    weight_poll_s: float = 0.05
    schedule: str = "free_running"    # "reproducible" | "free_running" (rl.schedule, rl/schedule.py;
                                      # the config default, which launch.py runs, is reproducible)

    def __post_init__(self):
        if self.worker_mode not in ("thread", "process"):
            raise ConfigError(f"rl.job.worker_mode must be 'thread' or 'process', got {self.worker_mode!r}")
        if self.stale_policy not in ("drop", "keep"):
            raise ConfigError(f"rl.stale_policy must be 'drop' or 'keep', got {self.stale_policy!r}")
        if self.schedule not in ("reproducible", "free_running"):
            raise ConfigError(f"rl.schedule must be 'reproducible' or 'free_running', got "
                              f"{self.schedule!r}")
        if self.backend not in ("local", "ray"):
            raise ConfigError(f"rl.job.backend must be 'local' or 'ray', got {self.backend!r}")
        for name in ("group_size", "batch_groups", "steps", "checkpoint_every", "num_workers"):
            if getattr(self, name) < 1:
                raise ConfigError(f"rl.{name} must be >= 1, got {getattr(self, name)}")


def settings_from_config(cfg, progress: bool = True) -> DriverSettings:
    """The driver's settings from a Config's `rl` section (and its seed)."""
    rl, job = cfg.rl, cfg.rl.job
    return DriverSettings(group_size=rl.group_size, batch_groups=rl.batch_groups,
                          max_staleness=rl.max_staleness, stale_policy=rl.stale_policy.value,
                          steps=rl.steps,
                          checkpoint_every=job.checkpoint_every, eval_every=job.eval_every,
                          num_workers=job.num_rollout_workers, worker_mode=job.worker_mode.value,
                          backend=job.backend.value, ray_address=job.ray_address,
                          inference_resource=job.inference_resource, seed=cfg.seed,
                          progress=progress, schedule=rl.schedule.value)
