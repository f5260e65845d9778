"""The RL services: trainer, inference, rollout workers and evaluator. They talk only through the
rollout stream (`rl/stream.py`) and the weight store (`publish(version, params)`, `fetch(version)`,
`latest()`); the backends (`backend_local.py`, `backend_ray.py`) decide where each one runs.

- `InferenceService`: owns the program's policy server; a poller applies every newer version of
  the weight store in flight (`PolicyServer.load_from`, between decode steps), never ending episodes.
- `run_job` (a rollout worker's body): one episode of one task sample through the policy client;
  any exception becomes an error rollout (reward 0, the reason in `error`), never a crashed run.
- `TrainerService`: takes B complete groups as soon as they are buffered, runs the learner's
  pure update step, publishes the new version, records the consumed groups, checkpoints, logs.
  Staleness is bounded at consumption: a group holding a rollout whose oldest token is more than
  `max_staleness` versions behind the trainer is dropped (stale_policy "drop": recorded as
  consumed, counted in `stale_dropped_*`, its admission slot released) or trained with the
  truncated IS correction ("keep": counted in `stale_kept_rollouts`).
- `EvaluatorService`: collects held-out episodes of one policy version and logs
  `eval_resolved_rate` when they are all in.
"""
from __future__ import annotations

import dataclasses
import sys
import threading
import time
import traceback
from typing import Callable

import numpy as np

from composer_jax.rl.program import PolicyClient, PolicyServer, RLProgram
from composer_jax.rl.rollout import Rollout
from composer_jax.rl.stream import RolloutLog, RolloutStream, rollout_id

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


def staleness(rollout: Rollout, trainer_version: int) -> int | None:
    """Trainer version minus the oldest policy version that sampled a token of the rollout."""
    used = rollout.versions_used()
    return None if used is None else trainer_version - used[0]


def resolved_of(rollout: Rollout) -> float:
    """1.0 when the episode was graded resolved (reward component or info flag), else 0.0."""
    if "resolved" in rollout.reward:
        return float(rollout.reward["resolved"] > 0)
    return float(bool(rollout.info.get("resolved", False)))


BEHAVIOUR_TERMS = ("valid_calls", "invalid_calls", "length", "communication", "effort",
                   "outside_edits", "false_claim")


def behaviour_metrics(rollouts: list[Rollout]) -> dict:
    """Per-batch agent behaviour of tool-using episodes (those whose info has `num_calls`):
    valid_call_rate (valid calls / calls, over the batch; absent when no call was made),
    tool_calls_mean, invalid_calls_mean, turns_mean, generated_tokens_mean, and the mean of each
    reward term (`reward_<term>_mean`: valid_calls, invalid_calls, length, communication, effort
    (the effort x, not a reward), outside_edits, false_claim). {} for other episodes (parity)."""
    eps = [r for r in rollouts if r.error is None and "num_calls" in r.info]
    if not eps:
        return {}
    calls = np.array([r.info["num_calls"] for r in eps], np.float64)
    invalid = np.array([r.info.get("num_invalid_calls", 0) for r in eps], np.float64)
    out = {"tool_calls_mean": float(calls.mean()), "invalid_calls_mean": float(invalid.mean()),
           "turns_mean": float(np.mean([r.info.get("num_turns", 0) for r in eps])),
           "generated_tokens_mean": float(np.mean([r.info.get("generated_tokens", 0)
                                                   for r in eps]))}
    if calls.sum() > 0:
        out["valid_call_rate"] = float((calls - invalid).clip(min=0).sum() / calls.sum())
    out.update(level_metrics(eps))
    for term in BEHAVIOUR_TERMS:
        vals = [r.reward[term] for r in eps if term in r.reward]
        if vals:
            out[f"reward_{term}_mean"] = float(np.mean(vals))
    return out


def level_metrics(rollouts: list[Rollout], prefix: str = "") -> dict:
    """Per difficulty level (episodes whose info has `level`, e.g. the lookup family's easy/hard):
    `<prefix><level>_generated_tokens_mean`, `_resolved_rate` and `_count`."""
    levels: dict[str, list[Rollout]] = {}
    for r in rollouts:
        if r.error is None and "level" in r.info:
            levels.setdefault(str(r.info["level"]), []).append(r)
    out = {}
    for level, rs in sorted(levels.items()):
        out[f"{prefix}{level}_generated_tokens_mean"] = float(np.mean(
            [r.info.get("generated_tokens", 0) for r in rs]))
        out[f"{prefix}{level}_resolved_rate"] = float(np.mean([resolved_of(r) for r in rs]))
        out[f"{prefix}{level}_count"] = float(len(rs))
    return out


def standard_error(values) -> float:
    """The standard error of the mean of `values` (sample std / sqrt(n); 0 for n < 2)."""
    v = np.asarray(list(values), np.float64)
    return float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else 0.0


def sync_stats(info, params) -> dict:
    """weight_sync_bytes / weight_sync_ratio from what a store's publish returned (an object or
    dict: bytes sent as `bytes_sent` or `bytes`, full size as `full_bytes` or `raw_bytes`, e.g.
    rl.weights.PublishStats); the full size is measured from `params` if absent."""
    get = (lambda k: info.get(k)) if isinstance(info, dict) else (lambda k: getattr(info, k, None))
    sent = get("bytes_sent") or get("bytes") or get("nbytes")
    full = get("full_bytes") or get("raw_bytes")
    if full is None:
        full = tree_nbytes(params)
    if sent is None:
        return {}
    return {"weight_sync_bytes": float(sent),
            "weight_sync_ratio": float(full) / max(float(sent), 1.0)}


def tree_nbytes(tree) -> int:
    """Bytes of every array leaf of a nested dict/list/tuple (or a JAX pytree)."""
    if isinstance(tree, dict):
        return sum(tree_nbytes(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(tree_nbytes(v) for v in tree)
    if hasattr(tree, "nbytes"):
        return int(tree.nbytes)
    import jax.tree_util as jtu  # other pytrees (trainer side, JAX already loaded)
    leaves = jtu.tree_leaves(tree)
    return sum(int(getattr(x, "nbytes", 0)) for x in leaves if x is not tree)


# ---------------------------------------------------------------------------------------------
# Inference
# ---------------------------------------------------------------------------------------------


class InferenceService:
    """The policy server plus a thread that applies new weight-store versions in flight."""

    def __init__(self, program: RLProgram, store, poll_s: float = 0.05):
        self.server: PolicyServer = program.make_policy()
        self.store = store
        self.poll_s = poll_s
        self.swaps = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def wait_for_weights(self, timeout: float = 600.0) -> int:
        """Blocks until the store has a version and loads it; returns it."""
        deadline = time.monotonic() + timeout
        while self.store.latest() is None:
            if time.monotonic() > deadline:
                raise TimeoutError("no weights were published to the weight store")
            time.sleep(self.poll_s)
        self.refresh()
        return self.server.version

    def refresh(self) -> bool:
        """Loads the store's latest version if it is newer than the server's."""
        v = self.store.latest()
        if v is None or v <= getattr(self.server, "version", -1):
            return False
        self.server.load_from(self.store, v)     # the server reads the store in its own layout
        self.swaps += 1
        return True

    def start(self) -> None:
        def loop():
            while not self._stop.is_set():
                self._wake.wait(self.poll_s)
                self._wake.clear()
                if not self._stop.is_set():
                    self.refresh()
        self._thread = threading.Thread(target=loop, name="weight-poller", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """A new version was published: look now instead of at the next poll (same process)."""
        self._wake.set()

    def rpc(self, method: str, args: tuple, kwargs: dict):
        return self.server.rpc(method, args, kwargs)

    def version(self) -> int:
        """The weight version new episodes sample with."""
        return int(getattr(self.server, "version", -1))

    def stats(self) -> dict:
        return {**self.server.stats(), "weight_swaps": self.swaps}

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        close = getattr(self.server, "close", None)
        if close is not None:
            close()


# ---------------------------------------------------------------------------------------------
# Trainer
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class TrainerProgress:
    """What the trainer thread shares with the driver (read under the GIL, written by one)."""
    version: int = 0
    consumed_groups: set = dataclasses.field(default_factory=set)
    rollouts_trained: int = 0
    tokens_trained: int = 0
    last_reward: float = float("nan")
    wait_s: float = 0.0
    busy_s: float = 0.0
    error: BaseException | None = None
    done: bool = False
    dropped_groups: int = 0          # groups dropped as too stale, over every life of the run


class TrainerService:
    """The training loop of an RL run (module docstring). `checkpoint(version, state, consumed)`
    saves synchronously; `log(version, metrics)` writes a metrics row."""

    def __init__(self, learner, stream: RolloutStream, store, log: RolloutLog, *, batch_groups: int,
                 total_steps: int, checkpoint_every: int, state, version: int,
                 consumed_groups: set, checkpoint: Callable, log_metrics: Callable,
                 rollouts_per_sec: Callable[[], float], on_publish: Callable[[], None] = None,
                 on_step: Callable[[int, object], None] | None = None,
                 max_staleness: int | None = None, stale_policy: str = "drop",
                 dropped_groups: int = 0):
        self.learner, self.stream, self.store, self.log = learner, stream, store, log
        self.batch_groups, self.total_steps = batch_groups, total_steps
        self.checkpoint_every = checkpoint_every
        self.state = state
        self.progress = TrainerProgress(version=version, consumed_groups=set(consumed_groups))
        self._checkpoint, self._log_metrics = checkpoint, log_metrics
        self._rollouts_per_sec = rollouts_per_sec
        self._on_publish = on_publish or (lambda: None)
        self._on_step = on_step or (lambda version, state: None)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.staleness_hist: list[int] = []
        if stale_policy not in ("drop", "keep"):
            raise ValueError(f"stale_policy must be 'drop' or 'keep', got {stale_policy!r}")
        self.max_staleness, self.stale_policy = max_staleness, stale_policy
        self.progress.dropped_groups = int(dropped_groups)

    def publish_current(self) -> dict:
        """Publishes the current state as its version (start of a run or after a restore)."""
        w = self.learner.weights(self.state)
        return sync_stats(self.store.publish(self.progress.version, w), w)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="trainer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.stream.close()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        try:
            while self.progress.version < self.total_steps and not self._stop.is_set():
                self._one_step()
        except BaseException as e:  # noqa: BLE001  (the driver re-raises it)
            self.progress.error = e
        finally:
            self.progress.done = True

    def _one_step(self) -> None:
        p = self.progress
        t0 = time.monotonic()
        groups, dropped = self._take_groups()
        if groups is None:
            return
        t1 = time.monotonic()
        rollouts = [r for g in groups for r in g.ordered()]
        stale = [s for s in (staleness(r, p.version) for r in rollouts) if s is not None]
        bound = self.max_staleness
        over = 0 if bound is None else sum(s > bound for s in stale)
        state, metrics = self.learner.step(self.state, [g.ordered() for g in groups])
        new_version = p.version + 1
        w = self.learner.weights(state)
        sync = sync_stats(self.store.publish(new_version, w), w)
        t2 = time.monotonic()
        dropped_rollouts = [r for g in dropped for r in g.ordered()]
        ids = [r.rollout_id for r in rollouts + dropped_rollouts]
        gids = [g.group_id for g in groups + dropped]
        self.log.append_consumed(new_version, gids, ids)
        self.state = state
        p.consumed_groups.update(gids)
        p.version = new_version
        self._on_publish()                 # the inference service loads it now, not at a poll
        self._on_step(new_version, state)  # e.g. the checkpoint evaluator copies the weights
        p.rollouts_trained += len(rollouts)
        tokens = sum(r.num_trainable for r in rollouts)
        p.tokens_trained += tokens
        p.wait_s += t1 - t0
        p.busy_s += t2 - t1
        rewards = np.array([r.total_reward for r in rollouts], np.float64)
        p.last_reward = float(rewards.mean())
        self.staleness_hist.extend(stale)
        row = {
            **{k: v for k, v in metrics.items() if np.ndim(v) == 0},
            "reward_mean": float(rewards.mean()),
            "resolved_rate": float(np.mean([resolved_of(r) for r in rollouts])),
            "error_rate": float(np.mean([r.error is not None for r in rollouts])),
            "staleness_mean": float(np.mean(stale)) if stale else 0.0,
            "staleness_max": float(max(stale)) if stale else 0.0,
            "stale_dropped_groups": float(len(dropped)),
            "stale_dropped_rollouts": float(len(dropped_rollouts)),
            "stale_dropped_groups_total": float(p.dropped_groups),
            "stale_kept_rollouts": float(over),
            **error_metrics(rollouts, getattr(self.learner, "error_penalty", None)),
            "trainer_idle_frac": (t1 - t0) / max(t2 - t0, 1e-9),
            "trainer_idle_frac_total": p.wait_s / max(p.wait_s + p.busy_s, 1e-9),
            "step_time_s": t2 - t0,
            "trained_tokens": float(tokens),
            "trained_tokens_per_sec": tokens / max(t2 - t0, 1e-9),
            "rollouts_per_sec": self._rollouts_per_sec(),
            **behaviour_metrics(rollouts),
            **sync,
        }
        self._log_metrics(new_version, row)
        # after the row: a resumed run keeps the rows up to its checkpoint, so none is missing
        if new_version % self.checkpoint_every == 0 or new_version == self.total_steps:
            self._checkpoint(new_version, state, p.consumed_groups)

    def _take_groups(self):
        """(B groups to train, groups dropped as too stale) or (None, dropped) when stopped.
        With stale_policy "drop", a group whose oldest token is more than max_staleness versions
        behind the trainer is set aside and replaced by the next complete group; the running
        count `progress.dropped_groups` tells the driver to release its admission slot."""
        p = self.progress
        kept, dropped = [], []
        while len(kept) < self.batch_groups:
            if self._stop.is_set():
                return None, dropped
            got = self.stream.get_groups(self.batch_groups - len(kept), timeout=0.5)
            for g in got or ():
                if self.stale_policy == "drop" and self.max_staleness is not None and \
                        group_staleness(g.ordered(), p.version) > self.max_staleness:
                    dropped.append(g)
                    p.dropped_groups += 1
                else:
                    kept.append(g)
        return kept, dropped


def group_staleness(rollouts: list[Rollout], trainer_version: int) -> int:
    """The largest staleness of a group's rollouts (-1 when none sampled a token)."""
    return max((s for s in (staleness(r, trainer_version) for r in rollouts) if s is not None),
               default=-1)


def error_metrics(rollouts: list[Rollout], penalty: float | None) -> dict:
    """error_penalised: error rollouts trained with reward -penalty (they have sampled tokens);
    error_excluded: error rollouts without a sampled token (nothing to train: left out, counted).
    With penalty None (a learner that excludes every error rollout) all count as excluded."""
    errs = [r for r in rollouts if r.error is not None]
    if penalty is None:
        return {"error_penalised": 0.0, "error_excluded": float(len(errs))}
    trainable = sum(r.num_trainable > 0 for r in errs)
    return {"error_penalised": float(trainable), "error_excluded": float(len(errs) - trainable)}


# ---------------------------------------------------------------------------------------------
# Evaluator
# ---------------------------------------------------------------------------------------------


class EvaluatorService:
    """Held-out evaluation of policy versions by the program's own held-out tasks (the parity
    program: held-out parity tasks, NOT the eval suite): the driver schedules one greedy episode
    per held-out task whenever the trainer passes a multiple of `eval_every`; `record` collects
    them and logs, once a version's episodes are all in, `heldout_parity_resolved_rate` and
    `heldout_parity_reward_mean` (prefix `name`), and the same rate under the stable name
    `eval_resolved_rate` with `eval_source` = 1 (held-out program tasks; the eval suite's
    checkpoint evaluator logs `eval_source` = 2)."""

    SOURCE = 1.0

    def __init__(self, tasks: list[str], eval_every: int, log_metrics: Callable,
                 name: str = "heldout_parity"):
        self.tasks, self.eval_every, self.name = list(tasks), eval_every, name
        self._log_metrics = log_metrics
        self._pending: dict[int, dict[str, Rollout]] = {}
        self.scheduled: set[int] = set()
        self.results: dict[int, dict] = {}

    def due(self, version: int) -> bool:
        return (bool(self.tasks) and self.eval_every > 0 and version % self.eval_every == 0
                and version not in self.scheduled)

    def jobs(self, version: int, seed: int) -> list[Job]:
        self.scheduled.add(version)
        self._pending[version] = {}
        return [Job(f"eval{version:06d}-{i:04d}", 0, t, seed + i, EVAL, version)
                for i, t in enumerate(self.tasks)]

    def record(self, job: Job, rollout: Rollout) -> None:
        got = self._pending.setdefault(job.eval_version, {})
        got[job.group_id] = rollout
        if len(got) == len(self.tasks):
            rs = list(got.values())
            res = [resolved_of(r) for r in rs]
            rate = float(np.mean(res))
            rewards = [r.total_reward for r in rs]
            row = {f"{self.name}_resolved_rate": rate,
                   f"{self.name}_resolved_se": standard_error(res),
                   f"{self.name}_reward_mean": float(np.mean(rewards)),
                   f"{self.name}_reward_se": standard_error(rewards),
                   f"{self.name}_error_rate": float(np.mean([r.error is not None for r in rs])),
                   f"{self.name}_num_tasks": float(len(rs)),
                   "eval_resolved_rate": rate, "eval_resolved_se": standard_error(res),
                   "eval_source": self.SOURCE, **level_metrics(rs, "eval_")}
            self.results[job.eval_version] = row
            del self._pending[job.eval_version]
            self._log_metrics(job.eval_version, row)

    def busy(self) -> bool:
        return bool(self._pending)


class CheckpointEvaluator:
    """Scores new policy versions with an external evaluation function (the eval suite's runner:
    `experiments/rl.py` passes `composer_jax.eval.api.eval_resolved_rate`, which the rl layer
    must not import). Every `eval_every`-th version (and the last), the trainer's weights are
    copied into a model (`learner.eval_model(state)`) and `eval_fn(model, version) -> dict` runs
    on the evaluator's own thread, one version at a time, beside training; its numeric results
    are logged at that version with `eval_source` = 2 (the eval suite)."""

    SOURCE = 2.0

    def __init__(self, eval_fn: Callable, eval_every: int, log_metrics: Callable,
                 final_version: int):
        self.eval_fn, self.eval_every, self.final = eval_fn, eval_every, final_version
        self._log_metrics = log_metrics
        self._queue: list[tuple[int, object]] = []
        self._cv = threading.Condition()
        self._running = False
        self.scheduled: set[int] = set()
        self.results: dict[int, dict] = {}
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="checkpoint-evaluator",
                                        daemon=True)
        self._thread.start()

    def due(self, version: int) -> bool:
        return version not in self.scheduled and (
            (self.eval_every > 0 and version % self.eval_every == 0) or version == self.final)

    def submit(self, version: int, model) -> None:
        with self._cv:
            self.scheduled.add(version)
            self._queue.append((version, model))
            self._cv.notify_all()

    def busy(self) -> bool:
        with self._cv:
            return bool(self._queue) or self._running

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue:
                    self._cv.wait()
                version, model = self._queue.pop(0)
                self._running = True
            t0 = time.monotonic()
            try:
                out = self.eval_fn(model, version)
                row = {k: float(v) for k, v in out.items()
                       if isinstance(v, (int, float, np.floating, np.integer))
                       and not isinstance(v, bool)}
                row.update(eval_source=self.SOURCE, eval_time_s=time.monotonic() - t0)
                self.results[version] = {**row, **{k: v for k, v in out.items()
                                                   if isinstance(v, str)}}
                self._log_metrics(version, row)
            except Exception as e:  # noqa: BLE001  (an evaluation failure is reported, not fatal)
                self.error = e
                self.results[version] = {"error": f"{type(e).__name__}: {e}"}
                print(f"warning: evaluation of version {version} failed: {type(e).__name__}: "
                      f"{e}\n{traceback.format_exc(limit=6)}", file=sys.stderr)
            finally:
                del model
                with self._cv:
                    self._running = False
                    self._cv.notify_all()
