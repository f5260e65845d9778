"""The policy versions a reproducible run may still sample with (`rl.schedule=reproducible`).

With lag S, the groups of trainer batch k are sampled with version max(0, k - S), so when a run
resumes from its checkpoint at version V, the unfinished groups of batches V..V+S need versions
V-S..V-1, which the trainer state alone cannot give back. Every published version is kept here
(WORKDIR/policy_versions/<v>.pkl: the published pytree as numpy arrays, written atomically) until
a checkpoint makes it unneeded (`prune`), and re-published on resume so the engine samples those
groups with exactly the weights of the first attempt.

    archive = VersionArchive(WORKDIR / "policy_versions")
    store = ArchivingStore(store, archive)      # the trainer publishes through it
    archive.prune(below=checkpoint_version - S)
    archive.republish(store, versions)          # on resume, before the trainer's own publish
"""
from __future__ import annotations

import pathlib
import pickle

import numpy as np

from composer_jax.agent.rollout import atomic_write_bytes
from composer_jax.errors import ComposerError


class VersionArchiveError(ComposerError, RuntimeError):
    """A version the schedule needs is not in the archive."""


def _to_numpy(tree):
    if isinstance(tree, dict):
        return {k: _to_numpy(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_to_numpy(v) for v in tree)
    return np.asarray(tree)


class VersionArchive:
    """Published weight versions on disk (module docstring)."""

    def __init__(self, root):
        self.root = pathlib.Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, version: int) -> pathlib.Path:
        return self.root / f"{version:07d}.pkl"

    def save(self, version: int, weights) -> None:
        atomic_write_bytes(self.path(version), pickle.dumps(_to_numpy(weights), protocol=5))

    def load(self, version: int):
        p = self.path(version)
        if not p.exists():
            raise VersionArchiveError(
                f"policy version {version} is not in {self.root} (have {self.versions()}): the "
                f"reproducible schedule cannot re-sample the groups that need it; resume with "
                f"rl.schedule=free_running, or start a new workdir")
        return pickle.loads(p.read_bytes())

    def versions(self) -> list[int]:
        return sorted(int(p.stem) for p in self.root.glob("*.pkl"))

    def prune(self, below: int) -> None:
        """Deletes the versions < `below` (no resume can need them any more)."""
        for v in self.versions():
            if v < below:
                self.path(v).unlink(missing_ok=True)

    def republish(self, store, versions) -> None:
        """Publishes the archived `versions` (ascending) to a fresh store."""
        for v in sorted(versions):
            store.publish(v, self.load(v))


class ArchivingStore:
    """The weight store as the trainer sees it: every publish is also archived."""

    def __init__(self, store, archive: VersionArchive):
        self.store, self.archive = store, archive

    def publish(self, version: int, params):
        self.archive.save(version, params)
        return self.store.publish(version, params)

    def __getattr__(self, name):
        return getattr(self.store, name)
