"""Turn-level episode checkpoints: what a token-level episode needs to resume on another worker
from its last completed turn (no JAX).

After every completed turn (the assistant turn sampled, its tool calls run) `TokenAgent` hands an
`EpisodeCheckpoint` to the episode's `checkpoint` sink:

    segments   the finished segments and the open one so far: every token with its behaviour
               log-prob, model log-prob, policy version and router row (what the engine saw)
    state      JSON: the agent's counters and conversation, the tool results not yet fed, the
               loop's position (turns, tokens, call index), the elapsed time, the workspace
               (`workspace_state`: a task family's in-process tools, or a sandbox workspace as a
               diff of files against the task snapshot) and the resumes so far

The sampler's RNG position needs no state: turns are sampled with a seed per (episode seed,
turn index) (`SeededTurns`), so a resumed turn k draws exactly what turn k would have drawn. A
resumed episode rebuilds a fresh engine session from the recorded ids (never re-tokenized text):
one prefill of the whole prefix (`rl.resume_mode=prefill`; measured on CPU: the next turns'
tokens equal an uninterrupted run's, their log-probs differ by ~1e-6 because the cache was
computed by one prefill instead of prefill + decode steps) or the recorded turns replayed with
their sampled ids forced through decode (`replay`: the same computation, bit-exact).

Records are a `Rollout` container (`to_bytes`: deterministic, SHA-256 checked); `CheckpointStore`
keeps the newest record per rollout id on disk (atomic writes), `MemoryCheckpoints` in memory.
"""
from __future__ import annotations

import base64
import dataclasses
import pathlib
import threading

from composer_jax.agent.rollout import Rollout, RolloutFormatError, Segment, atomic_write_bytes
from composer_jax.env.sandbox import SandboxKilled
from composer_jax.errors import ComposerError


class EpisodeInterrupted(ComposerError, RuntimeError):
    """The episode stopped for a reason outside the policy (the engine or a sandbox died): it can
    resume from its last checkpoint instead of counting as a failed episode."""


class EngineUnavailable(EpisodeInterrupted):
    """A call to the policy server failed (the engine service died or restarted)."""


def is_interruption(exc: BaseException) -> bool:
    """True for a failure outside the policy that a resume from the last checkpoint survives:
    `EpisodeInterrupted` (the engine) or `env.sandbox.SandboxKilled` (a tool call's sandbox was
    killed from outside; the resumed episode gets a fresh workspace restored from the checkpoint
    and runs the interrupted turn again)."""
    return isinstance(exc, (EpisodeInterrupted, SandboxKilled))


@dataclasses.dataclass
class EpisodeCheckpoint:
    """One episode after `turn` completed assistant turns (module docstring)."""
    rollout_id: str
    task_id: str
    turn: int
    segments: list[Segment]
    state: dict

    @property
    def generated(self) -> int:
        """Sampled tokens recorded so far (what a resume does not generate again)."""
        return int(self.state["ep"]["generated"])

    def to_bytes(self) -> bytes:
        r = Rollout(self.task_id, "", self.segments, {"total": 0.0}, rollout_id=self.rollout_id,
                    info={"episode_checkpoint": self.state, "turn": self.turn})
        return r.to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> "EpisodeCheckpoint":
        r = Rollout.from_bytes(data)
        if "episode_checkpoint" not in r.info:
            raise RolloutFormatError("not an episode checkpoint (a rollout record without "
                                     "info['episode_checkpoint'])")
        return cls(r.rollout_id, r.task_id, int(r.info["turn"]), list(r.segments),
                   r.info["episode_checkpoint"])


def _file_name(rollout_id: str) -> str:
    return rollout_id.replace("/", "__") + ".ckpt"


class CheckpointStore:
    """The newest checkpoint of each in-flight episode, one file per rollout id under `root`
    (written atomically, so a reader sees the previous checkpoint or the new one, never half)."""

    def __init__(self, root):
        self.root = pathlib.Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def put(self, rollout_id: str, data: bytes) -> None:
        atomic_write_bytes(self.root / _file_name(rollout_id), data)

    def get(self, rollout_id: str) -> bytes | None:
        p = self.root / _file_name(rollout_id)
        try:
            data = p.read_bytes()
        except FileNotFoundError:
            return None
        try:
            EpisodeCheckpoint.from_bytes(data)
        except RolloutFormatError:          # never written whole (atomic writes): start over
            return None
        return data

    def drop(self, rollout_id: str) -> None:
        (self.root / _file_name(rollout_id)).unlink(missing_ok=True)


class MemoryCheckpoints:
    """`CheckpointStore` in memory (thread workers: the episode survives an engine failure)."""

    def __init__(self):
        self._data: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def put(self, rollout_id: str, data: bytes) -> None:
        with self._lock:
            self._data[rollout_id] = data

    def get(self, rollout_id: str) -> bytes | None:
        with self._lock:
            return self._data.get(rollout_id)

    def drop(self, rollout_id: str) -> None:
        with self._lock:
            self._data.pop(rollout_id, None)


# ---------------------------------------------------------------------- workspaces

def workspace_state(ws) -> dict:
    """The tool workspace's state: `ws.checkpoint_state()` when it has one (a family's
    in-process tools), else a sandbox workspace's changed files against its snapshot (content,
    or None for a deleted file) and its call counters."""
    own = getattr(ws, "checkpoint_state", None)
    if own is not None:
        return {"kind": "own", "state": own()}
    if hasattr(ws, "changed_files") and hasattr(ws, "root"):
        files = {}
        for rel in ws.changed_files():
            p = pathlib.Path(ws.root) / rel
            files[rel] = base64.b64encode(p.read_bytes()).decode() if p.is_file() else None
        return {"kind": "files", "files": files, "num_calls": ws.num_calls,
                "num_invalid_calls": ws.num_invalid_calls}
    raise ComposerError(f"cannot checkpoint a workspace of type {type(ws).__name__}: give it "
                        f"checkpoint_state()/restore_state(state)")


def restore_workspace(ws, state: dict) -> None:
    """Puts `workspace_state`'s state into a fresh workspace of the same task."""
    if state["kind"] == "own":
        ws.restore_state(state["state"])
        return
    root = pathlib.Path(ws.root)
    for rel, content in sorted(state["files"].items()):
        p = root / rel
        if content is None:
            p.unlink(missing_ok=True)
            continue
        new_dirs = [d for d in reversed(p.relative_to(root).parents) if not (root / d).exists()]
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(base64.b64decode(content))
        give = getattr(ws, "give_to_sandbox", None)
        if give is not None:
            for d in new_dirs:
                give(root / d)
            give(p)
    ws.num_calls, ws.num_invalid_calls = state["num_calls"], state["num_invalid_calls"]
