"""The rollout stream: a persisted log of finished rollouts and the buffer of groups the trainer
takes batches from.

    log = RolloutLog(WORKDIR / "rollouts")
    stream = RolloutStream(log, group_size=G)
    stream.put(rollout)                      # written atomically to the log, THEN admitted
    groups = stream.get_groups(B, timeout)   # B complete groups (G rollouts of one task each),
                                             # as soon as B are complete, oldest first

Files (one directory per run):

    rollouts/<group_id>/<rollout_id>.rollout   one `Rollout` per file (`Rollout.save`: temp file,
                                               fsync, rename: a reader never sees half a record)
    rollouts/admitted.jsonl                    one line per started group {"group_id", "task_id",
                                               "index", "time"} (append-only; a torn last line is
                                               ignored, and terminated before the next append so
                                               it never swallows that line), so a restart knows
                                               which episodes were running and restarts them
    rollouts/consumed.jsonl                    one line per trainer step {"version", "groups",
                                               "rollout_ids"}; the trainer checkpoint is the truth
                                               and a restart truncates this file to it

Bounded: the admission rule (`rl/admission.py`) caps started-but-unconsumed groups at (S + 1)·B,
so the buffer never holds more than that; `put` refuses a rollout of a group that was never started
or a rollout id already logged (so no rollout can be trained twice through the stream).
Thread-safe. No JAX.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import pathlib
import threading
import time

from composer_jax.errors import ComposerError
from composer_jax.rl.rollout import Rollout, RolloutFormatError, atomic_write_bytes

ROLLOUT_SUFFIX = ".rollout"


class StreamError(ComposerError, RuntimeError):
    """The rollout stream was used inconsistently (unknown group, duplicate rollout id, ...)."""


def rollout_id(group_id: str, sample: int) -> str:
    """The id of sample `sample` of a group: a slot id, so a restarted episode reuses it."""
    return f"{group_id}-s{sample:03d}"


def group_name(index: int) -> str:
    """The id of the run's `index`-th started group."""
    return f"g{index:07d}"


@dataclasses.dataclass(frozen=True)
class LoggedRollout:
    """What a log scan knows about one record without keeping its arrays."""
    rollout_id: str
    group_id: str
    task_id: str
    path: pathlib.Path


class RolloutLog:
    """The run's rollout directory (module docstring). Only the stream's owner writes to it."""

    def __init__(self, root):
        self.root = pathlib.Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, rollout: Rollout) -> pathlib.Path:
        return self.record_path(rollout.group_id, rollout.rollout_id)

    def record_path(self, group_id: str, rid: str) -> pathlib.Path:
        """Where the record of rollout `rid` of group `group_id` is (or will be) written."""
        return self.root / group_id / (rid + ROLLOUT_SUFFIX)

    def write(self, rollout: Rollout) -> pathlib.Path:
        """Writes one finished rollout atomically (and durably) before anything else sees it."""
        return rollout.save(self.path(rollout))

    def scan(self) -> list[LoggedRollout]:
        """Every readable record in the log (a corrupted file is reported and skipped: its episode
        counts as unfinished and runs again)."""
        out = []
        for gdir in sorted(p for p in self.root.iterdir() if p.is_dir()):
            for f in sorted(gdir.glob("*" + ROLLOUT_SUFFIX)):
                try:
                    r = Rollout.load(f)
                except RolloutFormatError as e:
                    print(f"warning: unreadable rollout record {f} ({e}); its episode runs again")
                    f.rename(f.with_suffix(".unreadable"))
                    continue
                out.append(LoggedRollout(r.rollout_id, r.group_id, r.task_id, f))
        return out

    # ---------------------------------------------------------------- admitted / consumed logs

    def append_admitted(self, group_id: str, task_id: str, index: int) -> None:
        _append_line(self.root / "admitted.jsonl",
                     {"group_id": group_id, "task_id": task_id, "index": index,
                      "time": time.time()})

    def admitted(self) -> dict[str, dict]:
        """group_id -> its admitted.jsonl row."""
        return {row["group_id"]: row for row in read_jsonl(self.root / "admitted.jsonl")}

    def append_consumed(self, version: int, groups: list[str], rollout_ids: list[str]) -> None:
        _append_line(self.root / "consumed.jsonl",
                     {"version": version, "groups": groups, "rollout_ids": rollout_ids})

    def consumed_rows(self) -> list[dict]:
        return read_jsonl(self.root / "consumed.jsonl")

    def truncate_consumed(self, version: int) -> list[dict]:
        """Keeps the consumed rows of versions <= `version` (the restored checkpoint's): the steps
        after it are lost with the trainer state and their groups are trained again."""
        rows = [r for r in self.consumed_rows() if r["version"] <= version]
        text = "".join(json.dumps(r) + "\n" for r in rows)
        atomic_write_bytes(self.root / "consumed.jsonl", text.encode())
        return rows


def _append_line(path: pathlib.Path, row: dict) -> None:
    """Appends one JSON line durably. A torn last line (a run killed mid-append, power loss, a full
    disk) is first terminated, so it stays one unreadable line and never swallows this one."""
    line = (json.dumps(row) + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_jsonl(path: pathlib.Path) -> list[dict]:
    """The rows of a line-delimited JSON log ([] when missing), skipping a torn line."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue      # a torn last line from a killed run
    return rows


@dataclasses.dataclass
class Group:
    """G samples of one task, collected as they finish."""
    group_id: str
    task_id: str
    size: int
    rollouts: dict[int, Rollout] = dataclasses.field(default_factory=dict)
    started_at: float = dataclasses.field(default_factory=time.monotonic)

    @property
    def complete(self) -> bool:
        return len(self.rollouts) == self.size

    def ordered(self) -> list[Rollout]:
        return [self.rollouts[i] for i in sorted(self.rollouts)]


def group_of(rid: str) -> str:
    """The group id of a rollout id made by `rollout_id`."""
    sample_index(rid)                      # validates the form
    return rid.rsplit("-s", 1)[0]


def sample_index(rid: str) -> int:
    """The sample slot of a rollout id made by `rollout_id`."""
    try:
        return int(rid.rsplit("-s", 1)[1])
    except (IndexError, ValueError):
        raise StreamError(f"rollout id {rid!r} is not of the form <group>-sNNN") from None


class RolloutStream:
    """Persisted, bounded buffer of groups (module docstring)."""

    def __init__(self, log: RolloutLog, group_size: int):
        self.log = log
        self.group_size = group_size
        self._cv = threading.Condition()
        self._open: dict[str, Group] = {}                   # started, not complete
        self._ready: collections.OrderedDict[str, Group] = collections.OrderedDict()
        self._known: set[str] = set()                        # rollout ids logged (this run's life)
        self._closed = False
        self.num_put = 0
        self.num_errors = 0

    # ---------------------------------------------------------------- producer side

    def open_group(self, group_id: str, task_id: str) -> None:
        """Declares a started group (the dispatcher calls this when admission lets it start)."""
        with self._cv:
            if group_id in self._open or group_id in self._ready:
                raise StreamError(f"group {group_id} was opened twice")
            self._open[group_id] = Group(group_id, task_id, self.group_size)

    def put(self, rollout: Rollout) -> None:
        """Logs a finished rollout atomically, then admits it to its group."""
        with self._cv:
            group = self._open.get(rollout.group_id)
            if group is None:
                raise StreamError(f"rollout {rollout.rollout_id} belongs to group "
                                  f"{rollout.group_id}, which is not open (never started, or "
                                  f"already complete)")
            if rollout.rollout_id in self._known:
                raise StreamError(f"rollout {rollout.rollout_id} was already put")
            idx = sample_index(rollout.rollout_id)
            if not 0 <= idx < self.group_size or idx in group.rollouts:
                raise StreamError(f"rollout {rollout.rollout_id}: sample slot {idx} is invalid or "
                                  f"taken (group size {self.group_size})")
        self.log.write(rollout)                 # durable before it is admitted (outside the lock)
        with self._cv:
            self._admit(group, idx, rollout)

    def restore(self, rollout: Rollout) -> None:
        """Re-admits a rollout read back from the log on restart (no second write)."""
        with self._cv:
            group = self._open.get(rollout.group_id)
            if group is None:
                raise StreamError(f"restore: group {rollout.group_id} is not open")
            self._admit(group, sample_index(rollout.rollout_id), rollout)

    def _admit(self, group: Group, idx: int, rollout: Rollout) -> None:
        self._known.add(rollout.rollout_id)
        group.rollouts[idx] = rollout
        self.num_put += 1
        self.num_errors += rollout.error is not None
        if group.complete:
            del self._open[group.group_id]
            self._ready[group.group_id] = group
            self._cv.notify_all()

    def missing(self, group_id: str) -> list[int]:
        """Sample slots of an open group that have no finished rollout yet."""
        with self._cv:
            g = self._open.get(group_id)
            return [] if g is None else [i for i in range(self.group_size) if i not in g.rollouts]

    # ---------------------------------------------------------------- consumer side

    def get_groups(self, n: int, timeout: float | None = None) -> list[Group] | None:
        """Blocks until `n` complete groups are buffered and takes them (oldest completed first);
        None on timeout or when the stream is closed."""
        with self._cv:
            if not self._wait_for(lambda: len(self._ready) >= n, timeout):
                return None
            return [self._ready.popitem(last=False)[1] for _ in range(n)]

    def get_named(self, group_ids: list[str], timeout: float | None = None) -> list[Group] | None:
        """Blocks until every group in `group_ids` is complete and takes them, in that order (the
        reproducible schedule's job order); None on timeout or when the stream is closed."""
        with self._cv:
            if not self._wait_for(lambda: all(g in self._ready for g in group_ids), timeout):
                return None
            return [self._ready.pop(g) for g in group_ids]

    def _wait_for(self, ready, timeout: float | None) -> bool:
        """With the lock held: waits until `ready()`; False on timeout or when the stream closes."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not ready():
            if self._closed:
                return False
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            self._cv.wait(left if left is not None else 1.0)
        return True

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    # ---------------------------------------------------------------- introspection

    def num_ready(self) -> int:
        with self._cv:
            return len(self._ready)

    def num_open(self) -> int:
        with self._cv:
            return len(self._open)

    def buffered_rollouts(self) -> int:
        with self._cv:
            return sum(len(g.rollouts) for g in list(self._open.values()) +
                       list(self._ready.values()))
