"""The rollout record: exactly what the policy saw and sampled in one episode (numpy only, no JAX).

A `Rollout` is one episode of one task. Self-summarization splits an episode into several
`Segment`s (each a training sample that restarts from the system prompt + task + summary); every
segment shares the episode's final reward. A segment is one token sequence with per-token fields:

    tokens            int32   [T]   the ids the engine was fed or sampled, in order (from BOS)
    trainable         bool    [T]   True exactly on tokens the policy sampled (assistant bodies)
    logprobs          float32 [T]   behaviour log-prob under the sampling distribution (0 elsewhere)
    model_logprobs    float32 [T]   log-prob under the raw model at temperature 1 (0 elsewhere)
    versions          int32   [T]   policy version that sampled each token (-1 on fed tokens)
    router_indices    int32   [T, Lm, K] or None: routed experts of the forward pass *at* each
                                    position (the pass that predicts token t+1, fed or sampled);
                                    rows never run through the engine are -1 (the last position).
    turns             list[Turn]    where each turn's fed chunk and sampled chunk lie in `tokens`

Fed (non-trainable) tokens are the prompt, tool results, turn headers and any token the agent
appended itself (e.g. the `<|im_end|>` closing a turn cut at max_new_tokens); `Turn.fed` /
`Turn.sampled` give their spans, so tool-result tokens are `tokens[turn.fed_start:turn.fed_end]`.

Serialisation: `to_bytes()` / `from_bytes()` (a deterministic, pickle-free container: magic,
format version, JSON header, raw little-endian arrays, SHA-256 of everything before it) and
`save(path)` / `load(path)` (atomic: temp file + fsync + rename). A round trip is bit-exact:
`Rollout.load(p).to_bytes() == r.to_bytes()`.

Shape glossary: T tokens of a segment, Lm MoE layers, K routed experts per token.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import pathlib
import struct
import tempfile
from typing import Any, Iterator, Sequence

import numpy as np

from composer_jax.errors import ComposerError

FORMAT_VERSION = 1
MAGIC = b"CJROLLOUT\x00"
_PREFIX = struct.Struct("<10sIQ")      # magic, format version, header length
_DIGEST = 32                           # SHA-256 trailer

NO_VERSION = -1                        # `versions` on fed tokens
NO_EXPERT = -1                         # `router_indices` rows without a forward pass

# End reasons of a segment.
END_EPISODE = "episode"                # the episode ended in this segment
END_SUMMARIZED = "summarized"          # the context filled; the next segment restarts from a summary
END_ERROR = "error"                    # the episode crashed during this segment


class RolloutFormatError(ComposerError, ValueError):
    """A rollout file or record is malformed, truncated, corrupted or of an unknown version."""


@dataclasses.dataclass(frozen=True)
class Turn:
    """One agent turn inside a segment: tokens[fed_start:sample_start] were fed to the engine
    (tool results, next header), tokens[sample_start:sample_end] were sampled; then the agent may
    have appended tokens up to `end` (e.g. a closing `<|im_end|>` after truncation).
    finish_reason: the engine's ("stop_token", "stop_string", "max_new_tokens", "length") or
    "forced" for teacher-forced tokens; num_tool_calls / num_invalid_calls parsed from the text;
    truncated: the turn did not end on its own (the agent closed it); kind: "turn" or "summary"."""
    fed_start: int
    sample_start: int
    sample_end: int
    end: int
    finish_reason: str
    num_tool_calls: int = 0
    num_invalid_calls: int = 0
    truncated: bool = False
    kind: str = "turn"

    @property
    def fed(self) -> slice:
        return slice(self.fed_start, self.sample_start)

    @property
    def sampled(self) -> slice:
        return slice(self.sample_start, self.sample_end)


@dataclasses.dataclass(eq=False)
class Segment:
    """One training sample of a rollout (module docstring for the fields). `end_reason` is
    END_EPISODE, END_SUMMARIZED or END_ERROR."""
    tokens: np.ndarray
    trainable: np.ndarray
    logprobs: np.ndarray
    model_logprobs: np.ndarray
    versions: np.ndarray
    router_indices: np.ndarray | None = None
    turns: tuple[Turn, ...] = ()
    end_reason: str = END_EPISODE

    def __post_init__(self):
        self.tokens = np.ascontiguousarray(self.tokens, np.int32)
        self.trainable = np.ascontiguousarray(self.trainable, np.bool_)
        self.logprobs = np.ascontiguousarray(self.logprobs, np.float32)
        self.model_logprobs = np.ascontiguousarray(self.model_logprobs, np.float32)
        self.versions = np.ascontiguousarray(self.versions, np.int32)
        if self.router_indices is not None:
            self.router_indices = np.ascontiguousarray(self.router_indices, np.int32)
        self.turns = tuple(t if isinstance(t, Turn) else Turn(**t) for t in self.turns)
        self.validate()

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def num_trainable(self) -> int:
        return int(self.trainable.sum())

    def validate(self) -> None:
        """Raises RolloutFormatError unless the per-token fields are consistent."""
        t = self.tokens.shape
        if self.tokens.ndim != 1:
            raise RolloutFormatError(f"segment tokens must be 1-D, got shape {t}")
        for name in ("trainable", "logprobs", "model_logprobs", "versions"):
            if getattr(self, name).shape != t:
                raise RolloutFormatError(f"segment {name} has shape {getattr(self, name).shape}, "
                                         f"tokens {t}: every per-token field needs one value per token")
        r = self.router_indices
        if r is not None and (r.ndim != 3 or r.shape[0] != t[0]):
            raise RolloutFormatError(f"segment router_indices must be [T={t[0]}, Lm, K], got {r.shape}")
        if np.any(self.versions[self.trainable] < 0):
            raise RolloutFormatError("a trainable (sampled) token has no policy version")
        fed = ~self.trainable
        if np.any(self.versions[fed] != NO_VERSION) or np.any(self.logprobs[fed] != 0):
            raise RolloutFormatError("fed (non-trainable) tokens must have version -1 and logprob 0")
        if self.end_reason not in (END_EPISODE, END_SUMMARIZED, END_ERROR):
            raise RolloutFormatError(f"unknown segment end_reason {self.end_reason!r}")
        for turn in self.turns:
            if not 0 <= turn.fed_start <= turn.sample_start <= turn.sample_end <= turn.end <= t[0]:
                raise RolloutFormatError(f"turn spans out of order or past the segment: {turn}")

    def sampled_text_ids(self) -> Iterator[list[int]]:
        """The sampled ids of each turn, in order."""
        for turn in self.turns:
            yield self.tokens[turn.sampled].tolist()


@dataclasses.dataclass(eq=False)
class Rollout:
    """One episode (module docstring). reward: the reward breakdown by component name with the
    scalar in "total" (0 for an error rollout); timing: seconds by phase plus "start_time" (unix);
    info: JSON-able episode facts (stop reason, turns, calls, ...); error: why the episode crashed,
    None when it finished. format_version: the record's schema version."""
    task_id: str
    group_id: str
    segments: list[Segment]
    reward: dict[str, float]
    rollout_id: str = ""
    timing: dict[str, float] = dataclasses.field(default_factory=dict)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    error: str | None = None
    format_version: int = FORMAT_VERSION

    def __post_init__(self):
        self.segments = list(self.segments)
        self.reward = {str(k): float(v) for k, v in self.reward.items()}
        self.timing = {str(k): float(v) for k, v in self.timing.items()}
        if "total" not in self.reward:
            raise RolloutFormatError(f"reward needs a 'total' entry, got keys {sorted(self.reward)}")
        if self.error is not None and self.reward["total"] != 0.0:
            raise RolloutFormatError("an error rollout must have reward total 0")
        if self.format_version != FORMAT_VERSION:
            raise RolloutFormatError(f"rollout format version {self.format_version}; this code "
                                     f"reads version {FORMAT_VERSION}")

    @classmethod
    def failed(cls, task_id: str, group_id: str, error: str, segments: Sequence[Segment] = (),
               **kw) -> "Rollout":
        """An error rollout: the episode crashed; reward 0 (total and every component), the
        segments recorded so far are kept for inspection (a trainer should skip or zero them)."""
        segs = [dataclasses.replace(s, end_reason=END_ERROR) if i == len(segments) - 1 else s
                for i, s in enumerate(segments)]
        return cls(task_id, group_id, segs, {"total": 0.0}, error=error, **kw)

    @property
    def total_reward(self) -> float:
        return self.reward["total"]

    @property
    def num_tokens(self) -> int:
        return sum(len(s) for s in self.segments)

    @property
    def num_trainable(self) -> int:
        return sum(s.num_trainable for s in self.segments)

    def versions_used(self) -> tuple[int, int] | None:
        """(oldest, newest) policy version over sampled tokens, None if nothing was sampled."""
        v = [s.versions[s.trainable] for s in self.segments if s.num_trainable]
        if not v:
            return None
        allv = np.concatenate(v)
        return int(allv.min()), int(allv.max())

    def samples(self) -> Iterator[tuple[Segment, float]]:
        """(segment, reward) training samples: every segment carries the episode's total reward."""
        for s in self.segments:
            yield s, self.total_reward

    # ------------------------------------------------------------------ serialisation

    def to_bytes(self) -> bytes:
        """The deterministic binary record (module docstring)."""
        arrays: list[np.ndarray] = []
        seg_headers = []
        for s in self.segments:
            fields = {}
            for name in ("tokens", "trainable", "logprobs", "model_logprobs", "versions",
                         "router_indices"):
                a = getattr(s, name)
                if a is None:
                    fields[name] = None
                    continue
                fields[name] = len(arrays)
                arrays.append(a)
            seg_headers.append({"fields": fields, "turns": [dataclasses.asdict(t) for t in s.turns],
                                "end_reason": s.end_reason})
        table, offset = [], 0
        for a in arrays:
            le = a.astype(a.dtype.newbyteorder("<"), copy=False)
            table.append({"dtype": le.dtype.str, "shape": list(a.shape), "offset": offset,
                          "nbytes": int(le.nbytes)})
            offset += le.nbytes
        header = {"task_id": self.task_id, "group_id": self.group_id, "rollout_id": self.rollout_id,
                  "reward": self.reward, "timing": self.timing, "info": self.info,
                  "error": self.error, "segments": seg_headers, "arrays": table}
        head = json.dumps(header, sort_keys=True, allow_nan=True).encode("utf-8")
        body = b"".join(np.ascontiguousarray(a, a.dtype.newbyteorder("<")).tobytes()
                        for a in arrays)
        out = _PREFIX.pack(MAGIC, self.format_version, len(head)) + head + body
        return out + hashlib.sha256(out).digest()

    @classmethod
    def from_bytes(cls, data: bytes) -> "Rollout":
        """Parses `to_bytes` output; RolloutFormatError on a bad magic, version or checksum."""
        data = bytes(data)
        if len(data) < _PREFIX.size + _DIGEST:
            raise RolloutFormatError(f"rollout record of {len(data)} bytes is truncated")
        magic, version, head_len = _PREFIX.unpack_from(data)
        if magic != MAGIC:
            raise RolloutFormatError("not a rollout record (bad magic bytes)")
        if version != FORMAT_VERSION:
            raise RolloutFormatError(f"rollout format version {version}; this code reads "
                                     f"version {FORMAT_VERSION}")
        if hashlib.sha256(data[:-_DIGEST]).digest() != data[-_DIGEST:]:
            raise RolloutFormatError("rollout record checksum mismatch (corrupted or truncated)")
        head_end = _PREFIX.size + head_len
        header = json.loads(data[_PREFIX.size:head_end].decode("utf-8"))
        body = memoryview(data)[head_end:-_DIGEST]
        arrays = []
        for entry in header["arrays"]:
            dt = np.dtype(entry["dtype"])
            count = math.prod(entry["shape"])
            a = np.frombuffer(body, dt, count, entry["offset"]).reshape(entry["shape"])
            arrays.append(a.astype(dt.newbyteorder("="), copy=True))
        segments = []
        for sh in header["segments"]:
            f = {k: (None if i is None else arrays[i]) for k, i in sh["fields"].items()}
            segments.append(Segment(**f, turns=tuple(Turn(**t) for t in sh["turns"]),
                                    end_reason=sh["end_reason"]))
        return cls(header["task_id"], header["group_id"], segments, header["reward"],
                   rollout_id=header["rollout_id"], timing=header["timing"], info=header["info"],
                   error=header["error"], format_version=version)

    def save(self, path: str | os.PathLike) -> pathlib.Path:
        """Writes the record atomically (temp file in the same folder, fsync, rename)."""
        path = pathlib.Path(path)
        atomic_write_bytes(path, self.to_bytes())
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Rollout":
        return cls.from_bytes(pathlib.Path(path).read_bytes())

    def bit_equal(self, other: "Rollout") -> bool:
        """True when both records serialise to identical bytes (every bit of every field)."""
        return self.to_bytes() == other.to_bytes()


def atomic_write_bytes(path: pathlib.Path, data: bytes) -> None:
    """Writes `data` to `path` so that readers see either the old file or the complete new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class SegmentBuilder:
    """Accumulates one segment token by token, in the order the engine saw them.

        b = SegmentBuilder()
        b.feed(prompt_ids)                                  # fed: not trainable
        b.sample(ids, logprobs, model_logprobs, versions)   # sampled: trainable
        b.set_router(start, rows)                           # rows [n, Lm, K] for positions start..
        b.end_turn("stop_token", num_tool_calls=1)
        segment = b.build(END_EPISODE)
    """

    def __init__(self):
        self.tokens: list[int] = []
        self.trainable: list[bool] = []
        self.logprobs: list[float] = []
        self.model_logprobs: list[float] = []
        self.versions: list[int] = []
        self._router: dict[int, np.ndarray] = {}
        self._router_shape: tuple[int, ...] | None = None
        self.turns: list[Turn] = []
        self._turn_start = 0
        self._sample_span: tuple[int, int] | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def from_segment(cls, seg: Segment) -> "SegmentBuilder":
        """A builder holding `seg` between turns (a resumed episode's open segment): its tokens,
        per-token records, turns and the router rows that were set (rows of -1 were not)."""
        b = cls()
        b.tokens, b.trainable = seg.tokens.tolist(), seg.trainable.tolist()
        b.logprobs, b.model_logprobs = seg.logprobs.tolist(), seg.model_logprobs.tolist()
        b.versions, b.turns = seg.versions.tolist(), list(seg.turns)
        if seg.router_indices is not None:
            b._router_shape = seg.router_indices.shape[1:]
            b._router = {i: row.copy() for i, row in enumerate(seg.router_indices)
                         if np.any(row != NO_EXPERT)}
        b._turn_start = len(b.tokens)
        return b

    def feed(self, ids: Sequence[int]) -> int:
        """Appends fed (non-trainable) ids; returns the position of the first."""
        start = len(self.tokens)
        n = len(ids)
        self.tokens += [int(t) for t in ids]
        self.trainable += [False] * n
        self.logprobs += [0.0] * n
        self.model_logprobs += [0.0] * n
        self.versions += [NO_VERSION] * n
        return start

    def sample(self, ids: Sequence[int], logprobs: Sequence[float],
               model_logprobs: Sequence[float], versions: Sequence[int]) -> int:
        """Appends the sampled ids of the current turn with their per-token records."""
        n = len(ids)
        if not len(logprobs) == len(model_logprobs) == len(versions) == n:
            raise ValueError(f"sample(): {n} ids but {len(logprobs)} logprobs, "
                             f"{len(model_logprobs)} model logprobs, {len(versions)} versions")
        start = len(self.tokens)
        if self._sample_span is not None:
            raise ValueError("sample() called twice in one turn; call end_turn() between turns")
        self._sample_span = (start, start + n)
        self.tokens += [int(t) for t in ids]
        self.trainable += [True] * n
        self.logprobs += [float(x) for x in logprobs]
        self.model_logprobs += [float(x) for x in model_logprobs]
        self.versions += [int(v) for v in versions]
        return start

    def set_router(self, start: int, rows, overwrite: bool = True) -> None:
        """Routed experts rows [n, Lm, K] of the forward passes at positions start..start+n-1
        (overwrite=False keeps rows already set, e.g. when a session's cache was rebuilt)."""
        rows = np.asarray(rows, np.int32)
        if rows.ndim != 3:
            raise ValueError(f"router rows must be [n, Lm, K], got shape {rows.shape}")
        if self._router_shape is None:
            self._router_shape = rows.shape[1:]
        elif rows.shape[1:] != self._router_shape:
            raise ValueError(f"router rows {rows.shape[1:]} differ from earlier {self._router_shape}")
        for i, row in enumerate(rows):
            if overwrite or start + i not in self._router:
                self._router[start + i] = row

    def end_turn(self, finish_reason: str, *, num_tool_calls: int = 0, num_invalid_calls: int = 0,
                 truncated: bool = False, kind: str = "turn") -> Turn:
        """Closes the current turn (fed + sampled + anything fed after the sample)."""
        s0, s1 = self._sample_span if self._sample_span is not None else (len(self), len(self))
        turn = Turn(self._turn_start, s0, s1, len(self), finish_reason, num_tool_calls,
                    num_invalid_calls, truncated, kind)
        self.turns.append(turn)
        self._turn_start, self._sample_span = len(self), None
        return turn

    def build(self, end_reason: str = END_EPISODE) -> Segment:
        router = None
        if self._router_shape is not None:
            router = np.full((len(self),) + self._router_shape, NO_EXPERT, np.int32)
            for pos, row in self._router.items():
                if pos < len(self):
                    router[pos] = row
        return Segment(np.asarray(self.tokens, np.int32), np.asarray(self.trainable, np.bool_),
                       np.asarray(self.logprobs, np.float32),
                       np.asarray(self.model_logprobs, np.float32),
                       np.asarray(self.versions, np.int32), router, tuple(self.turns), end_reason)
