"""A rollout worker's unit of work: a `Job` (one episode of one task sample) and `run_job`, which
runs it through the program's env side; any exception becomes an error rollout (reward 0, the
reason in `error`), never a crashed run. No JAX."""
from __future__ import annotations

import dataclasses
import time
import traceback

from composer_jax.agent.rollout import Rollout
from composer_jax.rl.program import PolicyClient, RLProgram
from composer_jax.rl.stream import rollout_id

TRAIN, EVAL = "train", "eval"


@dataclasses.dataclass(frozen=True)
class Job:
    """One episode to run: sample `sample` of group `group_id` on task `task_id`."""
    group_id: str
    sample: int
    task_id: str
    seed: int
    kind: str = TRAIN          # TRAIN or EVAL (held-out, greedy, never enters the stream)
    eval_version: int = -1     # EVAL: the policy version that scheduled it

    @property
    def rollout_id(self) -> str:
        return rollout_id(self.group_id, self.sample)


def run_job(program: RLProgram, job: Job, policy: PolicyClient, worker: str = "") -> Rollout:
    """Runs one episode; a crash of the episode (sandbox, tool, agent) becomes an error rollout."""
    t0 = time.time()
    try:
        r = program.run_episode(job.task_id, job.seed, policy, greedy=job.kind == EVAL)
        r.group_id, r.rollout_id = job.group_id, job.rollout_id
    except Exception as e:  # noqa: BLE001  (every episode failure is data, not a crash)
        reason = f"{type(e).__name__}: {e}"
        r = Rollout.failed(job.task_id, job.group_id, reason, rollout_id=job.rollout_id,
                           info={"traceback": traceback.format_exc(limit=8)[-4000:]})
    r.timing.setdefault("start_time", t0)
    r.timing["episode_s"] = time.time() - t0
    r.info["worker"] = worker
    r.info["kind"] = job.kind
    return r
