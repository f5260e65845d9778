"""The reproducible schedule of asynchronous RL (`rl.schedule=reproducible`, the default).

With B groups per trainer step and lag S (`rl.max_staleness`), the run's i-th group (task and
sampling seeds fixed by (seed, i): `driver.task_for_group`, `driver.job_seed`) is

    sampled with version   v(i) = max(0, i // B - S)
    trained in step        i // B   (the step from version i // B to i // B + 1), in index order

so generation still overlaps training (the engine samples batch k with version k - S while the
trainer runs steps k - S .. k - 1), every trained rollout is exactly min(k, S) versions stale, and
nothing depends on thread timing: the same seed gives the same tokens, rewards, metrics (wall-clock
fields aside) and checkpoints, on any backend and worker mode, and after a kill and resume.

How the driver keeps it (`ReproducibleScheduler`): the engine is pinned to one version at a time
(`InferenceService.pin`); the groups of that version start only once the engine has loaded it; the
engine moves to the next version only when every episode of the current one (and its held-out
episodes, for families evaluated by the rollout workers) has finished and the trainer has
published the next. The trainer takes exactly the groups of its step, in index order
(`RolloutStream.get_named`). Measured on this CPU (benchmarks/results/engine_batch_invariance.txt),
the engine's batched decode is batch-invariant (a request's tokens and log-probs are bit-identical
whatever slot it lands in and whoever shares the batch), so concurrent episodes of one version need
no further ordering. On resume, the versions the unfinished groups need are re-published from the
run's `VersionArchive` (`rl/version_archive.py`).

What it costs against `free_running`: the tail of each version's episodes (workers idle while the
last episodes of a version finish) and staleness S for every batch instead of "whatever was
loaded" (benchmarks/rl_schedule_throughput.py measures rollouts/s of both).
"""
from __future__ import annotations

import collections
import dataclasses

from composer_jax.rl.jobs import Job
from composer_jax.rl.stream import group_name
from composer_jax.rl.version_archive import ArchivingStore, VersionArchive


@dataclasses.dataclass(frozen=True)
class VersionSchedule:
    """Which version samples group i and which groups a trainer step takes (module docstring)."""
    batch_groups: int       # B
    lag: int                # S

    def sampling_version(self, index: int) -> int:
        return max(0, index // self.batch_groups - self.lag)

    def groups_of_version(self, version: int) -> range:
        """The group indices sampled with `version`."""
        b = self.batch_groups
        if version == 0:
            return range(0, (self.lag + 1) * b)
        return range((version + self.lag) * b, (version + self.lag + 1) * b)

    def step_groups(self, version: int) -> list[str]:
        """The group ids the trainer step from `version` to `version + 1` takes, in order."""
        b = self.batch_groups
        return [group_name(i) for i in range(version * b, (version + 1) * b)]


class ReproducibleScheduler:
    """The driver's side of the reproducible schedule (module docstring). `run` is the driver's
    RLRun: its inference service, stream, evaluator, pending queue and group opener."""

    def __init__(self, run, archive_dir):
        s = run.settings
        self.run, self.settings = run, s
        self.vs = VersionSchedule(s.batch_groups, s.max_staleness)
        self.total = s.steps * s.batch_groups            # groups the run trains
        self.archive = VersionArchive(archive_dir)
        # resumed episodes wait for the version their group is sampled with
        self.held: dict[int, list[Job]] = collections.defaultdict(list)
        for job in run.pending:
            self.held[self.vs.sampling_version(int(job.group_id[1:]))].append(job)
        run.pending.clear()
        start_v = run.start.version
        first = min(self.held, default=self.vs.sampling_version(run.next_index))
        self.target = min(first, start_v)
        self.released: set[int] = set()

    # ---------------------------------------------------------------- set-up

    def trainer_store(self, store):
        """The store the trainer publishes through (every version archived)."""
        return ArchivingStore(store, self.archive)

    def republish(self, store, trainer_version: int) -> None:
        """A resumed run: the archived versions its unfinished groups need, before the trainer
        publishes its own (the store is fresh in a new process)."""
        self.archive.republish(store, range(self.target, trainer_version))

    def pin(self) -> None:
        self.run.inference.pin(self.target)

    def prune(self, checkpoint_version: int) -> None:
        """After a checkpoint at `checkpoint_version`: versions a resume from it cannot need."""
        self.archive.prune(checkpoint_version - self.vs.lag)

    # ---------------------------------------------------------------- one tick

    def loaded(self) -> bool:
        return self.run.inference.version() == self.target

    def follow(self, p) -> None:
        """Releases the current version's resumed episodes and held-out episodes, and moves the
        engine to the next version once this one's work is done and the trainer published it."""
        run = self.run
        if not self.loaded():
            return
        if self.target not in self.released:
            self.released.add(self.target)
            run.pending.extend(self.held.pop(self.target, []))
        ev = run.evaluator
        last = self.target == self.settings.steps
        if ev.due(self.target) or (last and ev.tasks and self.target not in ev.scheduled):
            run.pending.extendleft(reversed(ev.jobs(self.target,
                                                    self.settings.seed + 7919 * self.target)))
        if (p.version > self.target and self.target < self.settings.steps
                and self._version_done()):
            self.target += 1
            self.pin()

    def _version_done(self) -> bool:
        run = self.run
        if run.pending or run.evaluator.busy() or run.pool.num_idle() < run.pool.num_workers:
            return False
        idx = [i for i in self.vs.groups_of_version(self.target) if i < self.total]
        if idx and run.next_index <= idx[-1]:
            return False
        return all(not run.stream.missing(group_name(i)) for i in idx)

    def start_groups(self) -> None:
        """Opens the groups of the loaded version (in index order)."""
        run = self.run
        if not self.loaded():
            return
        for i in self.vs.groups_of_version(self.target):
            if i >= self.total:
                break
            if i >= run.next_index:
                run.open_group(i)

    def evaluating(self) -> bool:
        """Held-out episodes of the last version still to come (rollout-worker evaluation)."""
        ev, last = self.run.evaluator, self.settings.steps
        return bool(ev.tasks) and last not in ev.scheduled

    def __repr__(self) -> str:
        return f"ReproducibleScheduler(target={self.target}, held={sorted(self.held)})"
