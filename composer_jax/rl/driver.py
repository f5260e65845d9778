"""The asynchronous RL driver: admission control, the episode queue, worker replacement, resume.

    run_rl(spec, workdir, settings, store)     -> summary dict

One loop in the driver process: it starts groups while admission control allows
(`rl/admission.py`), hands episodes to the worker pool of the chosen backend, puts every finished
rollout into the stream (logged atomically first), re-runs the episode of a worker that died, and
schedules held-out evaluation of every `eval_every`-th version. The trainer runs in its own thread
and takes B complete groups as soon as the stream has them; the inference service applies new
weight versions in flight.

Resume: the newest RL checkpoint gives the trainer state and the consumed groups; every admitted
group that is not consumed is re-opened, its finished rollouts are re-admitted from the log and its
missing samples run again (same rollout ids); the consumed log is truncated to the checkpoint,
and metrics.jsonl / tb/ lose the rows past it (`runlog.MetricsWriter(resume_from=...)`). Each
checkpoint carries the run's running totals, so `rl_summary.json` covers the whole run. A run
whose newest checkpoint is at `steps` is finished: it says so and changes nothing.

Stop: when `stop_event` is set (experiments/rl.py sets it on SIGTERM / SIGINT) the trainer
finishes its current step, the current version is checkpointed and the summary written.

Services lost with their node (the Ray backend): the pool replaces dead rollout workers and
re-runs their episodes from their turn checkpoints; Ray restarts the inference actor and the
weight-store index elsewhere (`rl/backend_ray.py`); `follow` keeps the last version the inference
actor reported while it is down. `rl_summary.json` counts them (`service_restarts`).

Run directory: rollouts/ (the log), checkpoints/, metrics.jsonl, tb/, workers.json (live rollout
worker pids), plots/ (written at the end by `rl/plots.py`).
"""
from __future__ import annotations

import collections
import dataclasses
import json
import pathlib
import random
import sys
import threading
import time

from composer_jax.agent.episode_checkpoint import EpisodeCheckpoint
from composer_jax.agent.rollout import Rollout, atomic_write_bytes
from composer_jax.errors import ConfigError
from composer_jax.rl.admission import AdmissionControl
from composer_jax.rl.backend import Backend, make_backend
from composer_jax.rl.baseline import finish_baseline, resubmit_lost_baseline
from composer_jax.rl.checkpoint import RLCheckpointer
from composer_jax.rl.evaluators import CheckpointEvaluator, EvaluatorService
from composer_jax.rl.health import HealthMonitor, health_warnings
from composer_jax.rl.jobs import EVAL, Job
from composer_jax.rl.program import ProgramSpec, build_program
from composer_jax.rl.schedule import ReproducibleScheduler
from composer_jax.rl.settings import DriverSettings, settings_from_config  # noqa: F401  (old path)
from composer_jax.rl.stream import RolloutLog, RolloutStream, group_name
from composer_jax.rl.trainer import TrainerService, TrainerStart
from composer_jax.runlog import MetricsWriter, read_metrics
from composer_jax.train.run_checkpoint import checkpoint_steps


def task_for_group(tasks: list[str], index: int, seed: int) -> str:
    """The task of the run's `index`-th group: each epoch visits every task once, in a shuffled
    order that depends only on (seed, epoch), so a restarted run assigns the same tasks."""
    n = len(tasks)
    order = list(range(n))
    random.Random(seed * 1_000_003 + index // n).shuffle(order)
    return tasks[order[index % n]]


def job_seed(seed: int, index: int, sample: int) -> int:
    return (seed * 1_000_003 + index * 1_009 + sample) % (2**31 - 1)


def run_rl(spec: ProgramSpec, workdir, settings: DriverSettings, store,
           stop_event: threading.Event | None = None, eval_fn=None,
           backend: Backend | None = None) -> dict:
    """Runs (or resumes) an RL run until the trainer reaches `settings.steps` (module docstring).
    `store` is the weight store (publish/fetch/latest) shared by trainer and inference; `backend`
    builds the inference service and the worker pool (default: `make_backend(settings)`).
    `eval_fn(model, version) -> dict`: when given (and eval_every > 0), the checkpoint evaluator
    scores every eval_every-th version and the last with it (e.g. the eval suite's runner);
    otherwise the program's own held-out tasks are run as greedy episodes. A finished run
    returns its rl_summary.json with `already_finished` set, writing nothing."""
    workdir = pathlib.Path(workdir)
    done = already_finished(workdir, settings.steps)
    if done is not None:
        return done
    run = RLRun(spec, workdir, settings, store, eval_fn,
                backend if backend is not None else make_backend(settings))
    try:
        while True:
            p = run.trainer.progress
            if p.error is not None:
                raise p.error
            if stop_event is not None and stop_event.is_set():
                run.stopped_by = getattr(stop_event, "signal_name", "") or "stop request"
                break
            run.follow(p)                   # admission and held-out evaluation follow the trainer
            if p.done and not run.evaluating():
                break
            run.start_groups()
            run.dispatch()
            run.collect(tick_s=0.01)        # short: a loaded version is noticed within 10 ms
            run.report(p)
    finally:
        run.close()
    return summarize(run)


def finished_version(workdir, steps: int) -> int | None:
    """The newest checkpoint's version when it is >= `steps` (the run is finished), else None."""
    have = checkpoint_steps(workdir)
    return have[-1] if have and have[-1] >= steps else None


def already_finished(workdir: pathlib.Path, steps: int) -> dict | None:
    """A finished run's rl_summary.json with `already_finished` set (None when not finished)."""
    done_at = finished_version(workdir, steps)
    if done_at is None:
        return None
    path = workdir / "rl_summary.json"
    summary = json.loads(path.read_text()) if path.exists() else {"version": done_at}
    return {**summary, "already_finished": True, "version": done_at}


@dataclasses.dataclass
class Resumed:
    """Where a run starts (`resume`): learner state and version, the groups already trained on,
    episodes to (re)run, the next group index, groups started so far, rollouts re-admitted,
    the run's totals up to the restored checkpoint (`RLRun.totals`) and the consumed groups that
    were dropped as too stale."""
    state: object
    version: int
    consumed: set
    pending: collections.deque
    next_index: int
    started: int
    readmitted: int
    restored: bool
    prior: dict
    dropped: int = 0


def resume(learner, ckpt, log: RolloutLog, stream: RolloutStream,
           settings: DriverSettings) -> Resumed:
    """The newest RL checkpoint (or a fresh learner state); every admitted group that is not
    consumed is re-opened, its finished rollouts re-admitted from the log and its missing samples
    queued again (same rollout ids); the consumed log is truncated to the checkpoint."""
    restored = ckpt.restore_latest(learner.state_template()) if ckpt.manager.all_steps() else None
    if restored is None:
        state, version, consumed, prior, dropped = learner.init_state(), 0, set(), {}, 0
    else:
        state, meta = restored
        version, consumed = int(meta["version"]), set(meta["consumed_groups"])
        prior, dropped = meta.get("totals", {}), int(meta.get("dropped_groups", 0))
    log.truncate_consumed(version)
    admitted, logged = log.admitted(), log.scan()
    by_group = collections.defaultdict(list)
    for r in logged:                       # a group with a finished sample was started
        admitted.setdefault(r.group_id, {"group_id": r.group_id, "task_id": r.task_id,
                                         "index": int(r.group_id[1:])})
        by_group[r.group_id].append(r)
    pending: collections.deque[Job] = collections.deque()
    readmitted = 0
    for gid, row in sorted(admitted.items()):
        if gid in consumed:
            continue
        stream.open_group(gid, row["task_id"])
        for lr in by_group.get(gid, []):
            stream.restore(Rollout.load(lr.path))
            readmitted += 1
        for s in stream.missing(gid):
            pending.append(Job(gid, s, row["task_id"], job_seed(settings.seed, row["index"], s)))
    next_index = 1 + max([row["index"] for row in admitted.values()], default=-1)
    return Resumed(state, version, consumed, pending, next_index,
                   len(set(admitted) | consumed), readmitted, restored is not None, prior, dropped)


class _Metrics:
    """A thread-safe front for runlog.MetricsWriter (trainer and evaluator both write); rows past
    `resume_from` are dropped first. `train` is the newest trainer row (the one with
    `reward_mean`) and `train_step` its version."""

    def __init__(self, workdir: pathlib.Path, resume_from: int):
        self.writer = MetricsWriter(workdir, resume_from=resume_from)
        self.lock = threading.Lock()
        self.last: dict = {}
        rows = read_metrics(workdir)
        kept = [r for r in rows if "reward_mean" in r]
        self.train: dict = kept[-1] if kept else {}
        self.train_step: int = int(self.train.get("step", 0))
        self.health = HealthMonitor([r for r in rows if int(r.get("step", 0)) <= resume_from])

    def __call__(self, step: int, row: dict) -> None:
        with self.lock:
            self.writer.write(step, row)
            for w in self.health.check(step, row):      # rl/health.py: one line each
                print(w, file=sys.stderr)
            self.last.update(row)
            if "reward_mean" in row:
                self.train, self.train_step = dict(row), max(self.train_step, int(step))

    def close(self):
        self.writer.close()


class RLRun:
    """One run's services and bookkeeping; `run_rl` drives it. Built in this order: the program,
    rollout log and stream, admission control, checkpointer, learner, `resume`, the metrics
    writer, the trainer (and its first publish), the inference service, the evaluators, the
    worker pool."""

    def __init__(self, spec: ProgramSpec, workdir: pathlib.Path, settings: DriverSettings, store,
                 eval_fn, backend: Backend):
        workdir.mkdir(parents=True, exist_ok=True)
        self.spec, self.workdir, self.settings, self.store = spec, workdir, settings, store
        program = build_program(spec)
        self.train_tasks, self.eval_tasks = list(program.train_tasks()), list(program.eval_tasks())
        if not self.train_tasks:
            raise ConfigError("the RL program has no training tasks")
        self.log = RolloutLog(workdir / "rollouts")
        self.stream = RolloutStream(self.log, settings.group_size)
        self.admission = AdmissionControl(settings.batch_groups, settings.max_staleness)
        cfg = spec.kwargs.get("config") or {}
        self.ckpt = RLCheckpointer(workdir / "checkpoints", meta=(
            {"model": cfg["model"], "seed": cfg.get("seed", settings.seed)}
            if "model" in cfg else None), keep_period=settings.eval_every or None)
        self.learner = program.make_learner()
        self.start = resume(self.learner, self.ckpt, self.log, self.stream, settings)
        self.metrics = _Metrics(workdir, resume_from=self.start.version)
        self._resumed_message()
        self.stopped_by = ""
        self.pending, self.next_index = self.start.pending, self.start.next_index
        self.admission.started = self.start.started
        self.admission.release_to(self.start.dropped)
        self.admission.advance(self.start.version)
        self.repro = (ReproducibleScheduler(self, workdir / "policy_versions")   # rl/schedule.py
                      if settings.schedule == "reproducible" else None)
        self.t_start, self.put_at_start = time.monotonic(), self.stream.num_put
        self._start_services(program, store, eval_fn, backend)

    def _resumed_message(self) -> None:
        s = self.start
        if s.restored or s.readmitted:
            print(f"resumed at version {s.version}: {len(s.consumed)} groups consumed, "
                  f"{s.readmitted} finished rollouts re-admitted, {len(s.pending)} episodes to "
                  f"(re)run", file=sys.stderr)

    def _start_services(self, program, store, eval_fn, backend: Backend) -> None:
        st, settings = self.start, self.settings
        self.ckpt_eval = None
        if eval_fn is not None and settings.eval_every > 0:
            self.ckpt_eval = CheckpointEvaluator(eval_fn, settings.eval_every, self.metrics,
                                                 settings.steps)
        self.inference = None
        self.trainer = TrainerService(
            self.learner, self.stream, self.repro.trainer_store(store) if self.repro else store,
            self.log, self,
            TrainerStart(st.state, st.version, frozenset(st.consumed), st.dropped),
            batch_groups=settings.batch_groups, total_steps=settings.steps,
            checkpoint_every=settings.checkpoint_every, max_staleness=settings.max_staleness,
            stale_policy=settings.stale_policy,
            order=self.repro.vs.step_groups if self.repro else None)
        if not st.restored and settings.eval_every > 0:
            self.checkpoint(0, st.state, set())     # the starting policy, evaluated (WORKDIR@0)
        if self.repro is not None and st.restored:
            self.repro.republish(store, st.version)     # versions unfinished groups sample with
        if store.latest() != st.version:
            self.trainer.publish_current()
        self.inference = backend.make_inference(self.spec, store)
        if self.repro is not None:
            self.repro.pin()
        self.evaluator = EvaluatorService(self.eval_tasks if self.ckpt_eval is None else [],
                                          settings.eval_every, self.metrics,
                                          getattr(program, "eval_name", "heldout_parity"))
        self.eval_pin: int | None = None    # the version the engine is held at for held-out episodes
        self.eval_floor = st.version - 1 if st.restored else -1    # versions <= it are not due
        self._evaluate_checkpoint(st.version, self.trainer.state)   # the starting policy
        if st.restored:
            resubmit_lost_baseline(self)            # killed during version 0's evaluation
        self.pool = backend.make_pool(self.spec, self.inference)
        self.bar = _progress(settings, st.version)
        self.pids_written: list[int] = []
        self.trainer.start()

    # ---------------------------------------------------------------- TrainerHooks

    def checkpoint(self, version: int, state, consumed_groups: set) -> None:
        self.ckpt.save(version, state, consumed_groups, self.admission.started, self.totals(),
                       dropped_groups=self.trainer.progress.dropped_groups)
        if self.repro is not None:
            self.repro.prune(version)

    def totals(self) -> dict:
        """The whole run's totals so far: the restored checkpoint's plus this segment's."""
        p, prior = self.trainer.progress, self.start.prior
        hist = collections.Counter({int(k): v for k, v in prior.get("staleness_hist", {}).items()})
        hist.update(self.trainer.staleness_hist)
        return {"elapsed_s": prior.get("elapsed_s", 0.0) + time.monotonic() - self.t_start,
                "rollouts_trained": prior.get("rollouts_trained", 0) + p.rollouts_trained,
                "tokens_trained": prior.get("tokens_trained", 0) + p.tokens_trained,
                "trainer_wait_s": prior.get("trainer_wait_s", 0.0) + p.wait_s,
                "trainer_busy_s": prior.get("trainer_busy_s", 0.0) + p.busy_s,
                "staleness_hist": {str(k): v for k, v in sorted(hist.items())}}

    def log_metrics(self, version: int, row: dict) -> None:
        self.metrics(version, row)

    def rollouts_per_sec(self) -> float:
        return (self.stream.num_put - self.put_at_start) / max(time.monotonic() - self.t_start, 1e-9)

    def on_version(self, version: int, state) -> None:
        wake = getattr(self.inference, "wake", None)
        if wake is not None:
            wake()                          # the inference service loads it now, not at a poll
        self._evaluate_checkpoint(version, state)

    def _evaluate_checkpoint(self, version: int, state) -> None:
        if self.ckpt_eval is not None and self.ckpt_eval.due(version):
            self.ckpt_eval.submit(version, self.learner.eval_model(state))

    # ---------------------------------------------------------------- one tick of the loop

    def follow(self, p) -> None:
        """Admission counts the version new episodes will sample with: the trainer's, once the
        inference service has loaded it (so S = 0 is exactly synchronous), and frees the slots
        of groups the trainer dropped as too stale; held-out episodes of every eval_every-th
        version (and the last) go to the front of the queue. The reproducible schedule moves the
        engine from version to version itself (`ReproducibleScheduler.follow`)."""
        if self.repro is not None:
            return self.repro.follow(p)
        v = p.version
        if v > self.admission.version and self.inference.version() >= v:
            self.admission.advance(v)
        if p.dropped_groups > self.admission.released:
            self.admission.release_to(p.dropped_groups)
        self._follow_evaluation()

    def _follow_evaluation(self) -> None:
        """Held-out episodes of the free-running schedule sample with exactly the version they are
        logged under: when the engine serves a version that is due (it passed a multiple of
        eval_every, or it is the last), the engine is pinned there until that version's held-out
        episodes are all in (a worker that dies re-runs its episode at the same version), then
        released to the newest. Training episodes meanwhile sample with the pinned version."""
        ev = self.evaluator
        if self.eval_pin is not None:
            if not ev.busy():
                self.inference.pin(None)
                self.eval_pin = None
            return
        served = self.inference.version()
        if not ev.tasks or served <= self.eval_floor or served in ev.scheduled:
            return
        every = self.settings.eval_every
        passed = every > 0 and served // every > self.eval_floor // every    # floor -1: 0 is due
        if passed or served == self.settings.steps:
            self.inference.pin(served)
            self.eval_pin, self.eval_floor = served, served
            self.pending.extendleft(reversed(ev.jobs(served, self.settings.seed + 7919 * served)))

    def evaluating(self) -> bool:
        ev = self.evaluator
        final_due = (self.repro is None and bool(ev.tasks) and self.trainer.progress.done
                     and self.settings.steps not in ev.scheduled)
        return (final_due or ev.busy() or any(j.kind == EVAL for j in self.pending)
                or (self.ckpt_eval is not None and self.ckpt_eval.busy())
                or (self.repro is not None and self.repro.evaluating()))

    def start_groups(self) -> None:
        """Opens new groups while admission control allows (G episodes each); the reproducible
        schedule opens those of the engine's version."""
        s = self.settings
        if self.repro is not None:
            return self.repro.start_groups()
        while self.admission.can_start() and self.admission.active < s.steps * s.batch_groups:
            self.open_group(self.next_index)

    def open_group(self, i: int) -> None:
        """Starts the run's i-th group (the next index): logged, opened, its G episodes queued."""
        s, gid = self.settings, group_name(i)
        assert i == self.next_index, (i, self.next_index)
        task = task_for_group(self.train_tasks, i, s.seed)
        self.log.append_admitted(gid, task, i)
        self.stream.open_group(gid, task)
        self.admission.started += 1
        self.pending.extend(Job(gid, k, task, job_seed(s.seed, i, k))
                            for k in range(s.group_size))
        self.next_index += 1

    def dispatch(self) -> None:
        for _ in range(min(self.pool.num_idle(), len(self.pending))):
            self.pool.submit(self.pending.popleft())

    def collect(self, tick_s: float) -> None:
        """Finished episodes: training rollouts into the stream, held-out ones to the evaluator,
        the episode of a worker that died back to the front of the queue."""
        for job, rollout in self.pool.results(tick_s):
            if rollout is None:
                where = (f"resumes from turn {EpisodeCheckpoint.from_bytes(job.resume).turn}"
                         if job.resume is not None else "episode requeued")
                _warn(self.bar, f"warning: rollout worker died running {job.rollout_id}; "
                                f"replaced, {where}")
                self.pending.appendleft(job)
            elif job.kind == EVAL:
                self.evaluator.record(job, rollout)
            else:
                if rollout.error is not None:
                    _warn(self.bar, f"warning: episode {rollout.rollout_id} on "
                                    f"{rollout.task_id} failed: {rollout.error}")
                self.stream.put(rollout)

    def report(self, p) -> None:
        """workers.json (live worker pids) when it changed, and the progress bar."""
        pids = self.pool.worker_pids()
        if pids != self.pids_written:
            atomic_write_bytes(self.workdir / "workers.json", json.dumps(
                {"pids": pids, "restarts": self.pool.restarts}).encode())
            self.pids_written = pids
        _update(self.bar, self.stream, self.metrics)

    def close(self) -> None:
        """Stops every service; a stopped run first checkpoints the version it reached (the
        trainer finishes the step in progress and logs its row); version 0's held-out evaluation,
        if running, finishes first (`rl/baseline.py`)."""
        if self.stopped_by:
            finish_baseline(self)
        self.trainer.stop()
        self.trainer.join(timeout=600)       # a step in progress finishes (and logs its row)
        p = self.trainer.progress
        if self.stopped_by and p.error is None and p.version not in self.ckpt.manager.all_steps():
            self.checkpoint(p.version, self.trainer.state, p.consumed_groups)
        self.pool.close()
        self.inference_stats = self.inference.stats()
        self.inference.stop()
        self.ckpt.close()
        self.metrics.close()
        if self.bar is not None:
            self.bar.close()
        self.elapsed_s = time.monotonic() - self.t_start
        self.final_totals = self.totals()


def summarize(run: RLRun) -> dict:
    """The whole run's summary (the checkpointed totals of earlier segments included), also
    written to WORKDIR/rl_summary.json; `segment` holds this process's part."""
    p, tot, settings = run.trainer.progress, run.final_totals, run.settings
    finished = len(run.log.scan())      # every rollout the run finished (the log, all segments)
    evals = _eval_rows(run.workdir)
    evals.update({str(k): v for k, v in {**run.evaluator.results, **(
        run.ckpt_eval.results if run.ckpt_eval is not None else {})}.items()})
    elapsed = max(tot["elapsed_s"], 1e-9)
    summary = {
        "version": p.version, "steps": settings.steps, "finished": p.version >= settings.steps,
        "stopped_by": run.stopped_by, "rollouts_finished": finished,
        "rollouts_trained": tot["rollouts_trained"], "tokens_trained": tot["tokens_trained"],
        "error_rollouts": run.stream.num_errors, "worker_restarts": run.pool.restarts,
        "episodes_resumed": getattr(run.pool, "resumed", 0),
        "resumed_tokens_saved": getattr(run.pool, "tokens_saved", 0),
        "elapsed_s": tot["elapsed_s"], "rollouts_per_sec": finished / elapsed,
        "trained_tokens_per_sec": tot["tokens_trained"] / elapsed,
        "trainer_idle_frac": tot["trainer_wait_s"] / max(tot["trainer_wait_s"]
                                                         + tot["trainer_busy_s"], 1e-9),
        "staleness_hist": tot["staleness_hist"],
        "eval": dict(sorted(evals.items(), key=lambda kv: int(kv[0]))),
        "stale_dropped_groups": p.dropped_groups,
        "eval_source": ("eval suite (checkpoint evaluator)" if run.ckpt_eval is not None else
                        "held-out tasks of the program (parity: held-out parity tasks)"),
        "inference": run.inference_stats,
        **service_restarts(run),
        "resumed_from": run.start.version, "readmitted": run.start.readmitted,
        "warnings": health_warnings(read_metrics(run.workdir)),    # rl/health.py
        "segment": {"elapsed_s": run.elapsed_s,
                    "rollouts_finished": run.stream.num_put - run.put_at_start,
                    "rollouts_trained": p.rollouts_trained},
    }
    atomic_write_bytes(run.workdir / "rl_summary.json", json.dumps(summary, indent=1).encode())
    return summary


def service_restarts(run: RLRun) -> dict:
    """`service_restarts` by kind (rollout_worker, eval_worker: replaced by the pool; inference:
    restarted by Ray; weight_index: restarted by Ray and refilled from the trainer's copy) and
    `service_events`: each one's time (time.time()) and, for inference, seconds until it answered
    again (this process's part of the run)."""
    events = [{"kind": kind, "at": at} for at, kind in getattr(run.pool, "events", [])]
    events += [{"kind": "inference", "at": at, "down_s": down}
               for at, down in getattr(run.inference, "events", [])]
    events += [{"kind": "weight_index", "at": at}
               for at in getattr(getattr(run.store, "transport", None), "restores", [])]
    events.sort(key=lambda e: e["at"])
    kinds = ("rollout_worker", "eval_worker", "inference", "weight_index")
    return {"service_restarts": {k: sum(e["kind"] == k for e in events) for k in kinds},
            "service_events": events}


def _eval_rows(workdir: pathlib.Path) -> dict:
    """{version: held-out evaluation results} from metrics.jsonl (every segment of the run)."""
    out = {}
    for r in read_metrics(workdir):
        if "eval_resolved_rate" in r:
            out[str(r["step"])] = {k: v for k, v in r.items()
                                   if k.startswith(("eval_", "heldout_"))}
    return out


def _warn(bar, message: str) -> None:
    """A warning on its own line, above the progress bar (never glued onto it)."""
    if bar is not None:
        bar.write(message, file=sys.stderr)
    else:
        print(message, file=sys.stderr)


def _progress(settings: DriverSettings, version: int):
    if not settings.progress:
        return None
    from tqdm.auto import tqdm
    return tqdm(total=settings.steps, initial=version, desc="rl versions", unit="v",
                dynamic_ncols=True, file=sys.stderr)


def _update(bar, stream: RolloutStream, metrics: _Metrics) -> None:
    """Advances the bar to the newest logged trainer row, with that row's reward and staleness
    (so every shown version has its numbers; nothing before the first row)."""
    if bar is None:
        return
    row = metrics.train
    post = {"rollouts": stream.num_put}
    if row:
        post["reward"] = f"{row['reward_mean']:.3f}"
        post["stale"] = f"{row.get('staleness_mean', 0.0):.1f}"
    bar.set_postfix(post, refresh=False)
    if metrics.train_step > bar.n:
        bar.update(metrics.train_step - bar.n)
