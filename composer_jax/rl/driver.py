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
missing samples run again (same rollout ids); the consumed log is truncated to the checkpoint.

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
    """A thread-safe front for runlog.MetricsWriter (trainer and evaluator both write)."""

    def __init__(self, workdir: pathlib.Path):
        from composer_jax.runlog import MetricsWriter
        self.writer = MetricsWriter(workdir)
        self.lock = threading.Lock()
        self.last: dict = {}

    def __call__(self, step: int, row: dict) -> None:
        with self.lock:
            self.writer.write(step, row)
            self.last.update(row)

    def close(self):
        self.writer.close()


def _make_pool(settings: DriverSettings, spec: ProgramSpec, inference):
    if settings.backend == "ray":
        from composer_jax.rl.backend_ray import RayPool
        return RayPool(spec, inference, settings.num_workers)
    from composer_jax.rl.backend_local import ProcessPool, ThreadPool
    cls = ProcessPool if settings.worker_mode == "process" else ThreadPool
    return cls(spec, inference, settings.num_workers)


def run_rl(spec: ProgramSpec, workdir, settings: DriverSettings, store,
           stop_event: threading.Event | None = None, eval_fn=None) -> dict:
    """Runs (or resumes) an RL run until the trainer reaches `settings.steps` (module docstring).
    `store` is the weight store (publish/fetch/latest) shared by trainer and inference.
    `eval_fn(model, version) -> dict`: when given (and rl.eval_every > 0), the checkpoint evaluator
    scores every eval_every-th version and the last with it (e.g. the eval suite's runner);
    otherwise the program's own held-out tasks are run as greedy episodes."""
    from composer_jax.rl.checkpoint import RLCheckpointer

    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    program = build_program(spec)
    train_tasks, eval_tasks = list(program.train_tasks()), list(program.eval_tasks())
    if not train_tasks:
        raise ConfigError("the RL program has no training tasks")
    log = RolloutLog(workdir / "rollouts")
    stream = RolloutStream(log, settings.group_size)
    admission = AdmissionControl(settings.batch_groups, settings.max_staleness)
    ckpt = RLCheckpointer(workdir / "checkpoints")
    metrics = _Metrics(workdir)
    learner = program.make_learner()

    # ---- resume
    restored = ckpt.restore_latest(learner.state_template()) if ckpt.manager.all_steps() else None
    if restored is None:
        state, version, consumed, dropped = learner.init_state(), 0, set(), 0
    else:
        state, meta = restored
        version, consumed = int(meta["version"]), set(meta["consumed_groups"])
        dropped = int(meta.get("dropped_groups", 0))
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

    def checkpoint(v, st, groups):
        ckpt.save(v, st, groups, admission.started, trainer.progress.dropped_groups)

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
    try:
        while True:
            p = trainer.progress
            if p.error is not None:
                raise p.error
            if stop_event is not None and stop_event.is_set():
                break
            v = p.version
            # admission counts the version new episodes will sample with: the trainer's, once the
            # inference service has loaded it (so S = 0 is exactly synchronous)
            if v > admission.version and inference.version() >= v:
                admission.advance(v)
            if p.dropped_groups > admission.released:   # stale groups dropped: slots free again
                admission.release_to(p.dropped_groups)
            if evaluator.due(v) or (v == settings.steps and eval_tasks and
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
                    print(f"warning: rollout worker died running {job.rollout_id}; replaced, "
                          f"episode requeued", file=sys.stderr)
                    pending.appendleft(job)
                elif job.kind == EVAL:
                    evaluator.record(job, rollout)
                else:
                    if rollout.error is not None:
                        print(f"warning: episode {rollout.rollout_id} on {rollout.task_id} "
                              f"failed: {rollout.error}", file=sys.stderr)
                    stream.put(rollout)
            pids = pool.worker_pids()
            if pids != pids_written:
                atomic_write_bytes(workdir / "workers.json", json.dumps(
                    {"pids": pids, "restarts": pool.restarts}).encode())
                pids_written = pids
            _update(bar, p, stream, metrics.last)
    finally:
        trainer.stop()
        trainer.join(timeout=600)
        pool.close()
        inference_stats = inference.stats()
        inference.stop()
        ckpt.close()
        metrics.close()
        if bar is not None:
            bar.close()
    p = trainer.progress
    elapsed = time.monotonic() - t_start
    summary = {
        "version": p.version, "rollouts_finished": stream.num_put - put_at_start,
        "rollouts_trained": p.rollouts_trained, "tokens_trained": p.tokens_trained,
        "error_rollouts": stream.num_errors, "worker_restarts": pool.restarts,
        "elapsed_s": elapsed, "rollouts_per_sec": (stream.num_put - put_at_start) / elapsed,
        "trained_tokens_per_sec": p.tokens_trained / elapsed,
        "trainer_idle_frac": p.wait_s / max(p.wait_s + p.busy_s, 1e-9),
        "staleness_hist": dict(collections.Counter(trainer.staleness_hist)),
        "stale_dropped_groups": p.dropped_groups,
        "eval": {str(k): v for k, v in sorted({**evaluator.results, **(
            ckpt_eval.results if ckpt_eval is not None else {})}.items())},
        "eval_source": ("eval suite (checkpoint evaluator)" if ckpt_eval is not None else
                        "held-out tasks of the program (parity: held-out parity tasks)"),
        "inference": inference_stats,
        "resumed_from": version, "readmitted": readmitted,
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


def _progress(settings: DriverSettings, version: int):
    if not settings.progress:
        return None
    from tqdm.auto import tqdm
    return tqdm(total=settings.steps, initial=version, desc="rl versions", unit="v",
                dynamic_ncols=True, file=sys.stderr)


def _update(bar, p, stream: RolloutStream, last: dict) -> None:
    if bar is None:
        return
    if p.version > bar.n:
        bar.update(p.version - bar.n)
    bar.set_postfix(rollouts=stream.num_put, reward=f"{p.last_reward:.3f}",
                    stale=f"{last.get('staleness_mean', 0):.1f}", refresh=False)
