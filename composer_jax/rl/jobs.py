"""A rollout worker's unit of work: a `Job` (one episode of one task sample) and `run_job`, which
runs it through the program's env side; any exception becomes an error rollout (reward 0, the
reason in `error`), never a crashed run. No JAX.

Turn-level resume (programs with `resumable = True`, `agent.episode_checkpoint`): every completed
turn's checkpoint goes to `save(rollout_id, bytes)` (a process worker sends it to the driver,
which keeps it on disk); a job whose worker died comes back with its newest checkpoint in
`Job.resume` and continues from there on another worker. An episode interrupted by the engine or
a sandbox (`EpisodeInterrupted`) resumes from its last checkpoint on the same worker; after
`MAX_RESUMES` interruptions in a row without a later turn checkpointed in between it is an error
rollout.
The rollout's `info["interruptions"]` counts the in-place restarts on the worker that finished it,
`info["interrupted_by"]` names each one's exception ("EngineUnavailable", "SandboxKilled"); every
resume from a checkpoint, on any worker, is in `info["resumed_at_turns"]` with its cause in
`info["resumed_by"]` (one of those, or "worker_died")."""
from __future__ import annotations

import dataclasses
import time
import traceback

from composer_jax.agent.episode_checkpoint import EpisodeCheckpoint
from composer_jax.agent.rollout import Rollout
from composer_jax.rl.program import PolicyClient, RLProgram
from composer_jax.rl.stream import rollout_id

TRAIN, EVAL = "train", "eval"
MAX_RESUMES = 8                # in-place resumes in a row without progress (engine/sandbox died)
WORKER_DIED = "worker_died"    # the cause of a resume on another worker (`Job.resume`)


@dataclasses.dataclass(frozen=True)
class Job:
    """One episode to run: sample `sample` of group `group_id` on task `task_id`."""
    group_id: str
    sample: int
    task_id: str
    seed: int
    kind: str = TRAIN          # TRAIN or EVAL (held-out, greedy, never enters the stream)
    eval_version: int = -1     # EVAL: the policy version that scheduled it
    resume: bytes | None = None    # the newest EpisodeCheckpoint of a dead worker's attempt
    attempt: int = 0               # workers that died running it

    @property
    def rollout_id(self) -> str:
        return rollout_id(self.group_id, self.sample)


def run_job(program: RLProgram, job: Job, policy: PolicyClient, worker: str = "",
            save=None) -> Rollout:
    """Runs one episode; a crash of the episode (sandbox, tool, agent) becomes an error rollout.
    `save(rollout_id, checkpoint_bytes)`: where turn checkpoints go (module docstring)."""
    t0 = time.time()
    latest = {"data": job.resume}
    kw = {}
    if getattr(program, "resumable", False):
        def checkpoint(ck: EpisodeCheckpoint) -> None:
            data = ck.to_bytes()
            if save is not None:
                save(job.rollout_id, data)
            latest["data"] = data
        kw["checkpoint"] = checkpoint
    interruptions = stuck = 0
    causes = []                # the exception type of each interruption ("SandboxKilled", ...)
    while True:
        before = _turn(latest["data"])
        try:
            if "checkpoint" in kw:
                kw["resume"] = None
                if latest["data"] is not None:
                    kw["resume"] = EpisodeCheckpoint.from_bytes(latest["data"])
                    kw["resume"].state["cause"] = causes[-1] if causes else WORKER_DIED
            r = program.run_episode(job.task_id, job.seed, policy, greedy=job.kind == EVAL, **kw)
            r.group_id, r.rollout_id = job.group_id, job.rollout_id
        except Exception as e:  # noqa: BLE001  (every episode failure is data, not a crash)
            reason = f"{type(e).__name__}: {e}"
            r = Rollout.failed(job.task_id, job.group_id, reason, rollout_id=job.rollout_id,
                               info={"traceback": traceback.format_exc(limit=8)[-4000:]})
        if not (r.info.get("interrupted") and "checkpoint" in kw):
            break
        stuck = 1 if _turn(latest["data"]) > before else stuck + 1   # a later turn: progress
        if stuck > MAX_RESUMES:
            break
        interruptions += 1
        causes.append((r.error or "").split(":", 1)[0])
        time.sleep(min(0.2 * 2 ** (stuck - 1), 5.0))     # the engine or sandbox is coming back
    r.timing.setdefault("start_time", t0)
    r.timing["episode_s"] = time.time() - t0
    r.info["worker"] = worker
    r.info["kind"] = job.kind
    if job.attempt:
        r.info["worker_deaths"] = job.attempt
    if interruptions:
        r.info["interruptions"] = interruptions
        r.info["interrupted_by"] = causes
    return r


def _turn(data: bytes | None) -> int:
    """The completed turns of a checkpoint (0 without one)."""
    return EpisodeCheckpoint.from_bytes(data).turn if data is not None else 0
