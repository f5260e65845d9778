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

from composer_jax.errors import ConfigError
from composer_jax.rl.admission import AdmissionControl
from composer_jax.rl.program import ProgramSpec, build_program
from composer_jax.rl.rollout import Rollout, atomic_write_bytes
from composer_jax.rl.services import (EVAL, CheckpointEvaluator, EvaluatorService,
                                      InferenceService, Job, TrainerService)
from composer_jax.rl.stream import RolloutLog, RolloutStream, group_name, sample_index


@dataclasses.dataclass(frozen=True)
class DriverSettings:
    group_size: int = 4               # G
    batch_groups: int = 2             # B
    max_staleness: int = 2            # S (0 = synchronous)
    stale_policy: str = "drop"        # a group older than S at consumption: "drop" | "keep"
    steps: int = 10                   # trainer versions to reach
    checkpoint_every: int = 1
    eval_every: int = 0               # 0: no held-out evaluation
    num_workers: int = 4
    worker_mode: str = "thread"       # "thread" | "process" (local backend)
    backend: str = "local"            # "local" | "ray"
    ray_address: str = ""             # "" starts a local Ray cluster inside the run
    seed: int = 0
    progress: bool = True
    weight_poll_s: float = 0.05

    def __post_init__(self):
        if self.worker_mode not in ("thread", "process"):
            raise ConfigError(f"rl.worker_mode must be 'thread' or 'process', got {self.worker_mode!r}")
        if self.stale_policy not in ("drop", "keep"):
            raise ConfigError(f"rl.stale_policy must be 'drop' or 'keep', got {self.stale_policy!r}")
        if self.backend not in ("local", "ray"):
            raise ConfigError(f"rl.backend must be 'local' or 'ray', got {self.backend!r}")
        for name in ("group_size", "batch_groups", "steps", "checkpoint_every", "num_workers"):
            if getattr(self, name) < 1:
                raise ConfigError(f"rl.{name} must be >= 1, got {getattr(self, name)}")


def settings_from_config(cfg, progress: bool = True) -> DriverSettings:
    """The driver's settings from a Config's `rl` section (and its seed)."""
    rl = cfg.rl
    return DriverSettings(group_size=rl.group_size, batch_groups=rl.batch_groups,
                          max_staleness=rl.max_staleness, stale_policy=rl.stale_policy.value,
                          steps=rl.steps,
                          checkpoint_every=rl.checkpoint_every, eval_every=rl.eval_every,
                          num_workers=rl.num_rollout_workers, worker_mode=rl.worker_mode.value,
                          backend=rl.backend.value, ray_address=rl.ray_address, seed=cfg.seed,
                          progress=progress)


def task_for_group(tasks: list[str], index: int, seed: int) -> str:
    """The task of the run's `index`-th group: each epoch visits every task once, in a shuffled
    order that depends only on (seed, epoch), so a restarted run assigns the same tasks."""
    n = len(tasks)
    order = list(range(n))
    random.Random(seed * 1_000_003 + index // n).shuffle(order)
    return tasks[order[index % n]]


def job_seed(seed: int, index: int, sample: int) -> int:
    return (seed * 1_000_003 + index * 1_009 + sample) % (2**31 - 1)


class _Metrics:
    """A thread-safe front for runlog.MetricsWriter (trainer and evaluator both write); `train` is
    the newest trainer row (the one with `reward_mean`) and `train_step` its version."""

    def __init__(self, workdir: pathlib.Path, resume_from: int):
        from composer_jax.runlog import MetricsWriter, read_metrics
        self.writer = MetricsWriter(workdir, resume_from=resume_from)
        self.lock = threading.Lock()
        self.last: dict = {}
        kept = [r for r in read_metrics(workdir) if "reward_mean" in r]
        self.train: dict = kept[-1] if kept else {}
        self.train_step: int = int(self.train.get("step", 0))

    def __call__(self, step: int, row: dict) -> None:
        with self.lock:
            self.writer.write(step, row)
            self.last.update(row)
            if "reward_mean" in row:
                self.train, self.train_step = dict(row), max(self.train_step, int(step))

    def close(self):
        self.writer.close()


def _make_pool(settings: DriverSettings, spec: ProgramSpec, inference):
    if settings.backend == "ray":
        from composer_jax.rl.backend_ray import RayPool
        return RayPool(spec, inference, settings.num_workers)
    from composer_jax.rl.backend_local import ProcessPool, ThreadPool
    cls = ProcessPool if settings.worker_mode == "process" else ThreadPool
    return cls(spec, inference, settings.num_workers)


def finished_version(workdir, steps: int) -> int | None:
    """The newest checkpoint's version when it is >= `steps` (the run is finished), else None."""
    from composer_jax.train.run_checkpoint import checkpoint_steps
    have = checkpoint_steps(workdir)
    return have[-1] if have and have[-1] >= steps else None


def _warn(bar, message: str) -> None:
    """A warning on its own line, above the progress bar (never glued onto it)."""
    if bar is not None:
        bar.write(message, file=sys.stderr)
    else:
        print(message, file=sys.stderr)


def run_rl(spec: ProgramSpec, workdir, settings: DriverSettings, store,
           stop_event: threading.Event | None = None, eval_fn=None) -> dict:
    """Runs (or resumes) an RL run until the trainer reaches `settings.steps` (module docstring).
    A finished run returns its rl_summary.json with `already_finished` set, writing nothing.
    `store` is the weight store (publish/fetch/latest) shared by trainer and inference.
    `eval_fn(model, version) -> dict`: when given (and rl.eval_every > 0), the checkpoint evaluator
    scores every eval_every-th version and the last with it (e.g. the eval suite's runner);
    otherwise the program's own held-out tasks are run as greedy episodes."""
    from composer_jax.rl.checkpoint import RLCheckpointer

    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    done_at = finished_version(workdir, settings.steps)
    if done_at is not None:
        path = workdir / "rl_summary.json"
        summary = json.loads(path.read_text()) if path.exists() else {"version": done_at}
        return {**summary, "already_finished": True, "version": done_at}
    program = build_program(spec)
    train_tasks, eval_tasks = list(program.train_tasks()), list(program.eval_tasks())
    if not train_tasks:
        raise ConfigError("the RL program has no training tasks")
    log = RolloutLog(workdir / "rollouts")
    stream = RolloutStream(log, settings.group_size)
    admission = AdmissionControl(settings.batch_groups, settings.max_staleness)
    cfg_dict = spec.kwargs.get("config") or {}
    ckpt = RLCheckpointer(workdir / "checkpoints", meta=(
        {"model": cfg_dict["model"], "seed": cfg_dict.get("seed", settings.seed)}
        if "model" in cfg_dict else None), keep_period=settings.eval_every or None)
    learner = program.make_learner()

    # ---- resume
    restored = ckpt.restore_latest(learner.state_template()) if ckpt.manager.all_steps() else None
    if restored is None:
        state, version, consumed, prior, dropped = learner.init_state(), 0, set(), {}, 0
    else:
        state, meta = restored
        version, consumed = int(meta["version"]), set(meta["consumed_groups"])
        prior = meta.get("totals", {})
        dropped = int(meta.get("dropped_groups", 0))
    metrics = _Metrics(workdir, resume_from=version)
    log.truncate_consumed(version)
    admitted = log.admitted()
    logged = log.scan()
    for r in logged:                       # a group with a finished sample was started
        admitted.setdefault(r.group_id, {"group_id": r.group_id, "task_id": r.task_id,
                                         "index": int(r.group_id[1:])})
    pending: collections.deque[Job] = collections.deque()
    by_group = collections.defaultdict(list)
    for r in logged:
        by_group[r.group_id].append(r)
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
    admission.started = len(set(admitted) | consumed)
    admission.release_to(dropped)
    admission.advance(version)
    next_index = 1 + max([row["index"] for row in admitted.values()], default=-1)
    if restored is not None or readmitted:
        print(f"resumed at version {version}: {len(consumed)} groups consumed, {readmitted} "
              f"finished rollouts re-admitted, {len(pending)} episodes to (re)run",
              file=sys.stderr)

    t_start = time.monotonic()
    put_at_start = stream.num_put

    def rollouts_per_sec() -> float:
        return (stream.num_put - put_at_start) / max(time.monotonic() - t_start, 1e-9)

    def totals() -> dict:
        """The whole run's totals so far: the restored checkpoint's plus this segment's."""
        p = trainer.progress
        hist = collections.Counter({int(k): v for k, v in prior.get("staleness_hist", {}).items()})
        hist.update(trainer.staleness_hist)
        return {"elapsed_s": prior.get("elapsed_s", 0.0) + time.monotonic() - t_start,
                "rollouts_trained": prior.get("rollouts_trained", 0) + p.rollouts_trained,
                "tokens_trained": prior.get("tokens_trained", 0) + p.tokens_trained,
                "trainer_wait_s": prior.get("trainer_wait_s", 0.0) + p.wait_s,
                "trainer_busy_s": prior.get("trainer_busy_s", 0.0) + p.busy_s,
                "staleness_hist": {str(k): v for k, v in sorted(hist.items())}}

    def checkpoint(v, st, groups):
        ckpt.save(v, st, groups, admission.started, totals(),
                  dropped_groups=trainer.progress.dropped_groups)

    ckpt_eval = None
    if eval_fn is not None and settings.eval_every > 0:
        ckpt_eval = CheckpointEvaluator(eval_fn, settings.eval_every, metrics, settings.steps)

    def on_step(v, st):
        if ckpt_eval is not None and ckpt_eval.due(v):
            ckpt_eval.submit(v, learner.eval_model(st))

    trainer = TrainerService(learner, stream, store, log, batch_groups=settings.batch_groups,
                             total_steps=settings.steps, checkpoint_every=settings.checkpoint_every,
                             state=state, version=version, consumed_groups=consumed,
                             checkpoint=checkpoint, log_metrics=metrics,
                             rollouts_per_sec=rollouts_per_sec,
                             on_publish=lambda: wake_inference(), on_step=on_step,
                             max_staleness=settings.max_staleness,
                             stale_policy=settings.stale_policy, dropped_groups=dropped)
    if restored is None and settings.eval_every > 0:
        checkpoint(0, state, set())        # the starting policy, evaluated (WORKDIR@0)
    if store.latest() != version:
        trainer.publish_current()
    inference = _make_inference(settings, spec, store)
    wake_inference = getattr(inference, "wake", lambda: None)
    evaluator = EvaluatorService(eval_tasks if ckpt_eval is None else [], settings.eval_every,
                                 metrics, name=getattr(program, "heldout_name", "heldout_parity"))
    on_step(version, trainer.state)        # the starting policy (version 0 or the restored one)
    pool = _make_pool(settings, spec, inference)
    bar = _progress(settings, version)
    trainer.start()
    total_groups = settings.steps * settings.batch_groups
    pids_written: list[int] = []
    stopped = False
    try:
        while True:
            p = trainer.progress
            if p.error is not None:
                raise p.error
            if stop_event is not None and stop_event.is_set():
                stopped = True
                break
            v = p.version
            # admission counts the version new episodes will sample with: the trainer's, once the
            # inference service has loaded it (so S = 0 is exactly synchronous)
            if v > admission.version and inference.version() >= v:
                admission.advance(v)
            if p.dropped_groups > admission.released:   # stale groups dropped: slots free again
                admission.release_to(p.dropped_groups)
            if evaluator.due(v) or (v == settings.steps and evaluator.tasks and
                                    v not in evaluator.scheduled):
                pending.extendleft(reversed(evaluator.jobs(v, settings.seed + 7919 * v)))
            if (p.done and not evaluator.busy() and not any(j.kind == EVAL for j in pending)
                    and (ckpt_eval is None or not ckpt_eval.busy())):
                break
            while admission.can_start() and admission.active < total_groups:
                gid = group_name(next_index)
                task = task_for_group(train_tasks, next_index, settings.seed)
                log.append_admitted(gid, task, next_index)
                stream.open_group(gid, task)
                admission.start()
                pending.extend(Job(gid, s, task, job_seed(settings.seed, next_index, s))
                               for s in range(settings.group_size))
                next_index += 1
            for _ in range(min(pool.num_idle(), len(pending))):
                pool.submit(pending.popleft())
            # a short tick: the loop also notices a loaded version (admission) within 10 ms
            for job, rollout in pool.results(0.01):
                if rollout is None:          # the worker died mid-episode: run it again
                    _warn(bar, f"warning: rollout worker died running {job.rollout_id}; "
                               f"replaced, episode requeued")
                    pending.appendleft(job)
                elif job.kind == EVAL:
                    evaluator.record(job, rollout)
                else:
                    if rollout.error is not None:
                        _warn(bar, f"warning: episode {rollout.rollout_id} on {rollout.task_id} "
                                   f"failed: {rollout.error}")
                    stream.put(rollout)
            pids = pool.worker_pids()
            if pids != pids_written:
                atomic_write_bytes(workdir / "workers.json", json.dumps(
                    {"pids": pids, "restarts": pool.restarts}).encode())
                pids_written = pids
            _update(bar, stream, metrics)
    finally:
        trainer.stop()
        trainer.join(timeout=600)       # a step in progress finishes (and logs its row)
        p = trainer.progress
        if stopped and p.error is None and p.version not in ckpt.manager.all_steps():
            checkpoint(p.version, trainer.state, p.consumed_groups)
        pool.close()
        inference_stats = inference.stats()
        inference.stop()
        ckpt.close()
        metrics.close()
        if bar is not None:
            bar.close()
    p = trainer.progress
    elapsed = time.monotonic() - t_start
    tot = totals()
    finished = len(log.scan())           # every rollout the run finished (the log, all segments)
    evals = _eval_rows(workdir)
    evals.update({str(k): v for k, v in {**evaluator.results, **(
        ckpt_eval.results if ckpt_eval is not None else {})}.items()})
    summary = {
        "version": p.version, "steps": settings.steps, "finished": p.version >= settings.steps,
        "stopped_by": (getattr(stop_event, "signal_name", "") or "stop request") if stopped else "",
        "rollouts_finished": finished,
        "rollouts_trained": tot["rollouts_trained"], "tokens_trained": tot["tokens_trained"],
        "error_rollouts": stream.num_errors, "worker_restarts": pool.restarts,
        "elapsed_s": tot["elapsed_s"], "rollouts_per_sec": finished / max(tot["elapsed_s"], 1e-9),
        "trained_tokens_per_sec": tot["tokens_trained"] / max(tot["elapsed_s"], 1e-9),
        "trainer_idle_frac": tot["trainer_wait_s"] / max(tot["trainer_wait_s"]
                                                         + tot["trainer_busy_s"], 1e-9),
        "staleness_hist": tot["staleness_hist"],
        "eval": dict(sorted(evals.items(), key=lambda kv: int(kv[0]))),
        "stale_dropped_groups": p.dropped_groups,
        "eval_source": ("eval suite (checkpoint evaluator)" if ckpt_eval is not None else
                        "held-out tasks of the program (parity: held-out parity tasks)"),
        "inference": inference_stats,
        "resumed_from": version, "readmitted": readmitted,
        "segment": {"elapsed_s": elapsed, "rollouts_finished": stream.num_put - put_at_start,
                    "rollouts_trained": p.rollouts_trained},
    }
    atomic_write_bytes(workdir / "rl_summary.json", json.dumps(summary, indent=1).encode())
    return summary


def _make_inference(settings: DriverSettings, spec: ProgramSpec, store):
    if settings.backend == "ray":
        from composer_jax.rl.backend_ray import RayInference
        inf = RayInference(spec, store, settings)
    else:
        inf = InferenceService(build_program(spec), store, settings.weight_poll_s)
    inf.wait_for_weights()
    inf.start()
    return inf


def _eval_rows(workdir: pathlib.Path) -> dict:
    """{version: held-out evaluation results} from metrics.jsonl (every segment of the run)."""
    from composer_jax.runlog import read_metrics
    out = {}
    for r in read_metrics(workdir):
        if "eval_resolved_rate" in r:
            out[str(r["step"])] = {k: v for k, v in r.items()
                                   if k.startswith(("eval_", "heldout_"))}
    return out


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
