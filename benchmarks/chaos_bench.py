"""Chaos run: an asynchronous RL run with process rollout workers while a chaos thread kills, every
`--every` seconds, a random rollout worker (SIGKILL), the engine service (every request in flight
fails, every session is lost, a fresh engine with the same weights takes over) or, with
`--family coding`, a sandbox (SIGKILL of the outer bubblewrap process of a running tool call,
found in /proc among the rollout workers' descendants: `env.sandbox.running_sandboxes`).

    PYTHONPATH=$PWD python benchmarks/chaos_bench.py --out benchmarks/results/chaos_bench.txt
    PYTHONPATH=$PWD python benchmarks/chaos_bench.py --family coding \
        --out benchmarks/results/chaos_bench_coding.txt
    PYTHONPATH=$PWD python benchmarks/chaos_bench.py --ray_nodes 3 --every 30 --steps 40 \
        --batch-groups 1 --out benchmarks/results/chaos_nodes.txt

`--ray_nodes N`: whole Ray nodes are lost instead (benchmarks/chaos_nodes.py).

Reports: rollouts finished, error rollouts (with their reasons: an episode interrupted
`rl.jobs.MAX_RESUMES` times in a row without a new turn checkpointed is given up), worker deaths,
engine restarts and sandbox kills, turns resumed (episodes continued from a checkpoint, by a
replacement worker or in place after an engine restart or a sandbox kill; by cause, from the
rollouts' `resumed_by`),
sampled tokens saved by resuming (the checkpoints' recorded tokens, which a from-scratch re-run
would have sampled again) against the tokens regenerated (an upper bound: all sampled tokens of
the turn in flight at each interruption, and of turn 1 of episodes that had no checkpoint yet),
and the audit of the run directory (`rl.audit.audit_run`: no rollout trained twice, every consumed
group complete in the log).

`--family lookup` (default): the rl_async default (multi-turn read_file/finish episodes, the tiny
MoE after its cached SFT); the lookup family has no sandbox, so no sandbox kills.

`--family coding`: the coding task family (the rl_async_coding task pool, a real bubblewrap
sandbox per episode, the real grader and reward) with a scripted policy
(`rl.tasks.coding_scripted`): each turn is one tool call of the task's reference fix - run the
failing tests (the sandbox writes their output into the workspace), the fix by search_replace,
the tests again (printing that note), finish - forced through the engine of a fresh tiny MoE, so
every token has the engine's behaviour log-prob and the trainer trains on them. Why scripted: a
sampled coding episode of the trained SFT policy takes minutes on this 2-core machine (19
episodes in 12 minutes: experiments/rl.py) and a fresh policy never makes a valid tool call, while
a fault-injection run needs many multi-turn, tool-running episodes in a few minutes. The scripted
plan is stateless (turn k = the k-th call), so a resumed episode continues it; a resumed episode
resolves only if its workspace (the fix and the sandbox-written note) was restored from the
checkpoint, which the report counts. The tokenizer: a 4096-token BPE trained on the pool's
training tasks (cached), so no SFT run is needed.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import random
import signal
import sys
import tempfile
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


class RestartableServer:
    """The policy server with an engine that can be killed: `kill_engine()` replaces the engine
    with a fresh one (same weights, version and settings) and fails every request of the old one
    (its waiters get an error, as from a crashed engine service)."""

    def __init__(self, server):
        self.server = server
        self.generation = 0
        self.restarts = 0
        self._lock = threading.Lock()

    @property
    def version(self):
        return self.server.version

    def load_from(self, store, version):
        with self._lock:
            self.server.load_from(store, version)

    def stats(self):
        return {**self.server.stats(), "engine_restarts": self.restarts}

    def close(self):
        self.server.close()

    def rpc(self, method, args, kwargs):
        gen = self.generation
        if method == "submit":
            return gen * 1_000_000_000 + self.server.rpc(method, args, kwargs)
        if method == "wait":
            rid, rest = args[0], args[1:]
            if rid // 1_000_000_000 != gen:
                raise RuntimeError("the engine service restarted; the request is gone")
            out = self.server.rpc(method, (rid % 1_000_000_000,) + tuple(rest), kwargs)
            if self.generation != gen:
                raise RuntimeError("the engine service restarted during the request")
            return out
        return self.server.rpc(method, args, kwargs)

    def kill_engine(self) -> None:
        from composer_jax.inference.engine import Engine
        with self._lock:
            old = self.server.engine
            new = Engine(old.graphdef, old.state, old.cfg, version=old.version)
            new._next_id = old._next_id + 1      # request ids never collide with the old ones
            self.server.engine = new.start()
            self.generation += 1
            self.restarts += 1
        with old._lock:
            live = [rid for rid, c in old.completions.items() if not c.finished]
        futures = []
        for rid in live:
            try:
                futures.append(old.future(rid))
            except KeyError:                 # finished meanwhile
                pass
        for rid in live:
            old.cancel(rid)                  # their waiters return, and rpc raises for them
        for f in futures:
            try:
                f.result(timeout=60)
            except Exception:  # noqa: BLE001  (a cancelled or failed request: either is gone)
                pass
        old.stop(timeout=30)


class ChaosBackend:
    """The local backend (process workers) keeping handles on what it made."""

    def __init__(self, settings):
        from composer_jax.rl.backend import LocalBackend
        self.inner = LocalBackend(settings)
        self.inference = self.pool = None

    def make_store(self, sync):
        return self.inner.make_store(sync)

    def make_inference(self, spec, store):
        inf = self.inner.make_inference(spec, store)
        inf.server = RestartableServer(inf.server)
        self.inference = inf
        return inf

    def make_pool(self, spec, inference):
        self.pool = self.inner.make_pool(spec, inference)
        return self.pool

    def shutdown(self):
        self.inner.shutdown()


SANDBOX_WINDOW_S = 10.0        # how long a sandbox kill waits for a tool call to run


def kill_tool_sandbox(worker_pids, rng: random.Random, window: float, stop: threading.Event):
    """SIGKILLs the outer bwrap process of a random running tool call (a sandbox over an episode
    workspace, `.../cj-ws-*/ws`, not the grader's) below the rollout workers, waiting up to
    `window` seconds for one; its pid, or None if none ran."""
    from composer_jax.env.sandbox import running_sandboxes
    deadline = time.monotonic() + window
    while time.monotonic() < deadline and not stop.is_set():
        found = [sb for sb in running_sandboxes(tuple(worker_pids()))
                 if sb.workspace.endswith("/ws") and "/cj-ws-" in sb.workspace]
        if found:
            sb = rng.choice(found)
            try:
                os.kill(sb.pid, signal.SIGKILL)
                return sb.pid
            except ProcessLookupError:      # finished meanwhile: look again
                pass
        time.sleep(0.02)
    return None


def chaos(backend: ChaosBackend, every: float, seed: int, stop: threading.Event, events: list,
          kinds=("worker", "engine")):
    """Every `every` seconds one kill of a random kind: a worker's SIGKILL, an engine restart,
    or a tool call's sandbox SIGKILL (a "sandbox_miss" when no tool call ran for
    `SANDBOX_WINDOW_S`)."""
    rng = random.Random(seed)
    while not stop.wait(every):
        if backend.pool is None:
            continue
        kind = rng.choice(kinds)
        if kind == "worker":
            pids = backend.pool.worker_pids()
            if pids:
                pid = rng.choice(pids)
                try:
                    os.kill(pid, signal.SIGKILL)
                    events.append(("worker", time.monotonic(), pid))
                except ProcessLookupError:
                    pass
        elif kind == "engine":
            backend.inference.server.kill_engine()
            events.append(("engine", time.monotonic(), 0))
        else:
            pid = kill_tool_sandbox(backend.pool.worker_pids, rng, SANDBOX_WINDOW_S, stop)
            events.append(("sandbox" if pid else "sandbox_miss", time.monotonic(), pid or 0))


def tally(workdir: pathlib.Path) -> dict:
    """Resumes and tokens from the logged rollouts (module docstring). Every resume from a
    checkpoint is on record (`resumed_at_turns`, `resumed_by`: "worker_died", "EngineUnavailable",
    "SandboxKilled"); restarts from scratch (no checkpoint yet) are counted after worker deaths
    (`worker_deaths` less the "worker_died" resumes) and in place on the worker that finished the
    episode (`interruptions` less its in-place resumes: those after the last "worker_died")."""
    from composer_jax.agent.rollout import Rollout
    from composer_jax.rl.stream import RolloutLog
    out = dict(rollouts=0, resumed_rollouts=0, turns_resumed=0, tokens_saved=0,
               tokens_regenerated_max=0, restarts_from_scratch=0, sampled_tokens=0,
               resolved=0, resumed_resolved=0, multi_turn=0, tool_calls=0, resumed_by={},
               interrupted_by={}, errors=[])
    for logged in RolloutLog(workdir / "rollouts").scan():
        r = Rollout.load(logged.path)
        out["rollouts"] += 1
        out["sampled_tokens"] += r.num_trainable
        turns = [t for s in r.segments for t in s.turns]
        at = r.info.get("resumed_at_turns", [])
        by = r.info.get("resumed_by", [])
        out["turns_resumed"] += len(at)
        out["resumed_rollouts"] += bool(at)
        out["tokens_saved"] += sum(r.info.get("resumed_tokens_saved", []))
        out["resolved"] += bool(r.info.get("resolved"))
        out["resumed_resolved"] += bool(at) and bool(r.info.get("resolved"))
        out["multi_turn"] += r.info.get("num_turns", 0) >= 2
        out["tool_calls"] += r.info.get("num_calls", 0)
        for cause in by:
            out["resumed_by"][cause] = out["resumed_by"].get(cause, 0) + 1
        for cause in r.info.get("interrupted_by", []):
            out["interrupted_by"][cause] = out["interrupted_by"].get(cause, 0) + 1
        if r.error is not None:
            out["errors"].append(f"{r.rollout_id}: {r.error.splitlines()[0][:120]} (in-place "
                                 f"restarts {r.info.get('interruptions', 0)}, completed turns "
                                 f"{r.info.get('num_turns', 0)})")
        for k in at:                       # the turn in flight when it was interrupted
            if k < len(turns):
                out["tokens_regenerated_max"] += turns[k].sample_end - turns[k].sample_start
        last_died = max((i for i, c in enumerate(by) if c == "worker_died"), default=-1)
        scratch = (r.info.get("worker_deaths", 0) - by.count("worker_died")
                   + r.info.get("interruptions", 0) - len(by[last_died + 1:]))
        if scratch > 0 and turns:
            out["restarts_from_scratch"] += scratch
            out["tokens_regenerated_max"] += scratch * (turns[0].sample_end - turns[0].sample_start)
    return out


def lookup_config(a):
    """The rl_async default (lookup family) with the run's settings."""
    from composer_jax import registry
    cfg = registry.get("rl_async").make_config()
    return dataclasses.replace(cfg, rl=dataclasses.replace(
        cfg.rl, task=dataclasses.replace(cfg.rl.task, num_eval_tasks=8)))


def pool_tokenizer(pool: pathlib.Path, cache: pathlib.Path, vocab_size: int = 4096) -> pathlib.Path:
    """A BPE trained on the pool's training tasks (their files and statements), the system prompt
    and the tool declarations; cached by the pool manifest."""
    import hashlib

    from composer_jax.agent.rollout import atomic_write_bytes
    from composer_jax.data.config import SplitPattern
    from composer_jax.data.tokenizer import train_tokenizer
    from composer_jax.env import protocol
    from composer_jax.env.tasks.pool import TaskPool
    from composer_jax.env.tools import TOOL_SPECS
    manifest = (pool / "manifest.json").read_bytes() if (pool / "manifest.json").exists() else b""
    path = cache / "chaos_tokenizer" / (hashlib.sha256(
        manifest + str(pool).encode() + str(vocab_size).encode()).hexdigest()[:12] + ".json")
    if path.exists():
        return path
    tp = TaskPool(pool)
    texts = [json.dumps(list(TOOL_SPECS)), protocol.SYSTEM_PROMPT]
    for t in tp.tasks():
        if t.split == "train":
            texts.append(t.problem_statement)
            texts += [f.read_text(errors="replace") for f in (tp.task_dir(t.task_id) / "snapshot")
                      .rglob("*.py") if f.is_file()]
    tok = train_tokenizer(texts, vocab_size, SplitPattern.KIMI)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.json")
    tok.save(tmp)
    atomic_write_bytes(path, tmp.read_bytes())
    tmp.unlink()
    return path


def coding_config(a):
    """The rl_async_coding settings (its task pool, sandbox and grader) with the scripted coding
    family on a fresh tiny MoE (module docstring)."""
    from composer_jax import registry
    from composer_jax.config import tiny
    from composer_jax.data.tokenizer import load_tokenizer
    from composer_jax.rl.tasks.coding import _cache, ensure_pool
    from composer_jax.rl.tasks.coding_scripted import ScriptedCodingTaskConfig
    cfg = registry.get("rl_async_coding").make_config()
    pool = ensure_pool(cfg)
    tok_path = pool_tokenizer(pool, _cache(cfg))
    vocab = load_tokenizer(tok_path).vocab_size
    model = dataclasses.replace(tiny(), vocab_size=vocab, mtp_depth=0,
                                max_position_embeddings=a.seq_len)
    env = dataclasses.replace(cfg.env, pool_dir=str(pool), max_turns=12)
    task = ScriptedCodingTaskConfig(num_train_tasks=cfg.rl.task.num_train_tasks,
                                    num_eval_tasks=cfg.rl.task.num_eval_tasks,
                                    tokenizer=str(tok_path))
    rl = dataclasses.replace(cfg.rl, task=task, seq_len=a.seq_len, max_new_tokens=768,
                             summary_trigger_tokens=0)
    return dataclasses.replace(cfg, model=model, env=env, rl=rl)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--family", default="lookup", choices=("lookup", "coding"))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--batch-groups", type=int, default=2)
    ap.add_argument("--every", type=float, default=3.0, help="seconds between kills")
    ap.add_argument("--seq-len", type=int, default=4096, help="--family coding: the rows")
    ap.add_argument("--resume-mode", default="prefill", choices=("prefill", "replay"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("--ray_nodes", type=int, default=0,
                    help="> 1: node-loss chaos on a local Ray cluster of this many nodes "
                         "(benchmarks/chaos_nodes.py; --every: seconds between node losses)")
    a = ap.parse_args(argv)
    if a.ray_nodes:
        if a.ray_nodes < 2 or a.family != "lookup":
            ap.error("--ray_nodes needs at least 2 nodes (a head and one to lose) and the "
                     "lookup family")
        import chaos_nodes
        return chaos_nodes.main(a, list(argv if argv is not None else sys.argv[1:]))
    import faulthandler
    faulthandler.register(signal.SIGUSR1)       # kill -USR1 PID: every thread's stack

    from composer_jax.rl.audit import audit_run
    from composer_jax.rl.driver import run_rl
    from composer_jax.rl.jobs import MAX_RESUMES
    from composer_jax.rl.settings import settings_from_config
    from composer_jax.rl.task_program import task_program_spec
    from composer_jax.rl.weights import WeightSyncSettings
    from machine_load import uptime
    coding = a.family == "coding"
    load0 = uptime()
    cfg = coding_config(a) if coding else lookup_config(a)
    rl = dataclasses.replace(
        cfg.rl, steps=a.steps, group_size=a.group_size, batch_groups=a.batch_groups,
        resume_mode=a.resume_mode,
        job=dataclasses.replace(cfg.rl.job, num_rollout_workers=a.workers, worker_mode="process",
                                eval_every=0, checkpoint_every=a.steps))
    cfg = dataclasses.replace(cfg, rl=rl, seed=a.seed)
    workdir = pathlib.Path(a.workdir or tempfile.mkdtemp(prefix="chaos-"))
    settings = dataclasses.replace(settings_from_config(cfg), progress=False)
    backend = ChaosBackend(settings)
    store = backend.make_store(WeightSyncSettings(**dataclasses.asdict(cfg.rl.weight_sync)))
    stop, events = threading.Event(), []
    kinds = ("worker", "engine", "sandbox") if coding else ("worker", "engine")
    th = threading.Thread(target=chaos, args=(backend, a.every, a.seed, stop, events, kinds),
                          daemon=True)
    t0 = time.monotonic()
    th.start()
    try:
        summary = run_rl(task_program_spec(cfg), workdir, settings, store, backend=backend)
    finally:
        stop.set()
        th.join()
        backend.shutdown()
    wall = time.monotonic() - t0
    audit = audit_run(workdir, a.group_size)
    t = tally(workdir)
    kills = {k: sum(e[0] == k for e in events)
             for k in ("worker", "engine", "sandbox", "sandbox_miss")}
    load = uptime()
    if coding:
        title = ("RL run (coding task family: rl_async_coding's pool, bubblewrap sandboxes, the "
                 "grader; scripted policy = the reference fix forced through a fresh tiny MoE's "
                 "engine; process rollout workers)")
        sandbox = (f"sandbox SIGKILL {kills['sandbox']} (+{kills['sandbox_miss']} turns of the "
                   f"chaos thread with no tool call running within {SANDBOX_WINDOW_S:g}s)")
    else:
        title = "RL run (rl_async lookup family, tiny MoE, process rollout workers)"
        sandbox = "sandbox 0 (the lookup family has no sandbox)"
    lines = [
        f"# chaos_bench: {title} with a random kill every few seconds",
        f"command: PYTHONPATH=$PWD python benchmarks/chaos_bench.py {' '.join(argv or sys.argv[1:])}",
        f"load before: {load0}",
        f"load after:  {load}",
        f"settings: family={a.family} steps={a.steps} workers={a.workers} G={a.group_size} "
        f"B={a.batch_groups} kill every {a.every}s resume_mode={a.resume_mode} seed={a.seed}; "
        f"wall {wall:.0f}s",
        f"kills: worker SIGKILL {kills['worker']}, engine restart {kills['engine']}, {sandbox}",
        f"trainer versions reached: {summary['version']}/{a.steps}",
        f"rollouts finished: {summary['rollouts_finished']}  trained: "
        f"{summary['rollouts_trained']}  error rollouts: {summary['error_rollouts']}",
        f"worker restarts (pool): {summary['worker_restarts']}  episodes sent back with a "
        f"checkpoint: {summary['episodes_resumed']}",
        f"turns resumed: {t['turns_resumed']} (in {t['resumed_rollouts']} rollouts), by cause: "
        f"{json.dumps(t['resumed_by'], sort_keys=True)}; restarts from scratch (no checkpoint "
        f"yet): {t['restarts_from_scratch']}",
        f"in-place restarts (from a checkpoint or from scratch) on the workers that finished the "
        f"episodes, by cause: {json.dumps(t['interrupted_by'], sort_keys=True)}",
        f"sampled tokens: {t['sampled_tokens']}; saved by resuming: {t['tokens_saved']}; "
        f"regenerated (at most): {t['tokens_regenerated_max']} (from scratch, the interrupted "
        f"episodes would have sampled up to {t['tokens_saved'] + t['tokens_regenerated_max']} "
        f"again)",
    ]
    if coding:
        lines.append(
            f"episodes (logged): {t['rollouts']}, multi-turn {t['multi_turn']}, tool calls "
            f"{t['tool_calls']}; resolved {t['resolved']}/{t['rollouts']}; resumed episodes "
            f"resolved {t['resumed_resolved']}/{t['resumed_rollouts']} (a resumed episode "
            f"resolves only with its workspace restored from the checkpoint)")
    lines += [f"error rollout {e}" for e in t["errors"]]
    if t["errors"]:
        lines.append(f"(run_job gives up on an episode after {MAX_RESUMES} interruptions in a row "
                     f"without a new turn checkpointed; its error rollout is logged and trained "
                     f"with reward 0, not lost)")
    lines += [
        f"audit: {json.dumps(audit)}",
        "lost: 0 (every consumed group complete in the log), trained twice: 0 "
        "(audit_run passed)",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        pathlib.Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(a.out).write_text(text)
    return {"summary": summary, "audit": audit, "tally": t, "kills": kills}


if __name__ == "__main__":
    main()
