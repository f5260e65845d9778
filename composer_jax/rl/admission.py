"""Staleness by admission control (AReaL / SkyRL style), counted in groups of G samples of one task.

With `B` groups per trainer batch, trainer version `v` (= number of completed RL steps) and
maximum staleness `S` (`rl.max_staleness`), a new group may start only while

    started  <=  (S + v + 1) * B          started = accepted (finished, consumed or not) + running

counted over the whole run (a resumed run counts the groups of its earlier lives too). The driver
advances `v` only once the inference service has loaded version v, so every token of a group is
sampled by a version >= the one that admitted it, and at most (S + 1)·B groups are started but not
consumed. When groups finish in the order they started, each is trained at most S versions after
the version that sampled it. A straggler (a group that finishes after groups started later) can be
older, since the trainer takes complete groups as they come and never waits for one; the
trainer bounds it at consumption (`rl/trainer.py`, rl.stale_policy: "drop" sets such a group
aside, and `release_to` gives its slot back, so `started - released` is what counts against
the capacity; "keep" trains it with the IS correction). `S = 0` is synchronous RL: one batch is
generated with version v, trained, then the next one starts.

Pure bookkeeping, no threads and no clock: the dispatcher asks `can_start()` and calls
`start()` / `advance(v)`; callers hold their own lock.
"""
from __future__ import annotations

import dataclasses

from composer_jax.errors import ConfigError


@dataclasses.dataclass
class AdmissionControl:
    """Counts started groups against the capacity (S + v + 1)·B (module docstring)."""
    batch_groups: int          # B
    max_staleness: int         # S
    started: int = 0           # groups ever started (accepted + running), over every life of the run
    version: int = 0           # trainer version v
    released: int = 0          # started groups dropped at consumption (their slots are free again)

    def __post_init__(self):
        if self.batch_groups < 1:
            raise ConfigError(f"rl.batch_groups must be >= 1, got {self.batch_groups}")
        if self.max_staleness < 0:
            raise ConfigError(f"rl.max_staleness must be >= 0, got {self.max_staleness}")

    @property
    def capacity(self) -> int:
        """Most groups that may have started by trainer version `version`."""
        return (self.max_staleness + self.version + 1) * self.batch_groups

    @property
    def active(self) -> int:
        """Started groups that count against the capacity: started minus released."""
        return self.started - self.released

    def free(self) -> int:
        """How many more groups may start now (>= 0)."""
        return max(0, self.capacity - self.active)

    def can_start(self) -> bool:
        return self.active < self.capacity

    def release_to(self, released: int) -> None:
        """The trainer has dropped `released` started groups in all (counts only grow)."""
        if released < self.released:
            raise RuntimeError(f"admission: released groups went back from {self.released} to "
                               f"{released}")
        self.released = released

    def start(self) -> None:
        """Records that one group started; it must have been allowed."""
        if not self.can_start():
            raise RuntimeError(f"admission: {self.started} groups started, capacity "
                               f"{self.capacity} at version {self.version}")
        self.started += 1

    def advance(self, version: int) -> None:
        """The trainer reached `version` (versions only grow)."""
        if version < self.version:
            raise RuntimeError(f"admission: trainer version went back from {self.version} to "
                               f"{version}")
        self.version = version

    def staleness_bound(self) -> int:
        """The largest staleness (trainer version minus sampling version) the rule allows."""
        return self.max_staleness
