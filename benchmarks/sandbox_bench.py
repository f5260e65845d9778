"""Sandbox benchmark: start-up latency and sandboxed test runs per second.

  python benchmarks/sandbox_bench.py [--pool DIR] [--seconds 20] [--workers 2] [--out FILE]

1. Start-up: the median wall time of `Sandbox.run("true")` (bubblewrap with fresh pid/net/ipc/uts
   namespaces, read-only system binds, privilege drop, rlimits, bash), measured from Python —
   i.e. everything a tool call pays before its command starts. Targets: median <= 20 ms.
2. Throughput: grading runs of real tasks (each task's FAIL_TO_PASS + PASS_TO_PASS ids through the
   unittest runner with the task's interpreter) in `--workers` threads for `--seconds`, on the
   reference fix, both cold (fresh sandbox and interpreter per run) and warm (the sandboxed fork
   server generation uses). Target: >= 20 runs/s on 2 cores. Tasks come from `--pool` (an env_generate pool);
   without one, a small pool is generated first into a temporary directory.
3. Grading: `grade_workspace` on a workspace holding the reference fix, exactly as an episode ends
   (with the hardened grader: kill the episode's processes, diff against the snapshot, fresh
   snapshot copy with only the source changes, reference copies hidden, isolated runner), in
   `--workers` threads for `--seconds`. Opening the workspace is not timed.
4. With `--base DIR` (a checkout of an earlier commit, e.g. `git archive <commit> | tar -x -C DIR`):
   grading throughput side by side - base and this tree alternate `--rounds` times, each in its own
   process on the same pool, workers and seconds - with the ratio new/base. Each side grades every
   task once untimed first (the system index, and for this tree the per-task reference run, which
   is cached), and the one-time reference cost per task is reported on its own.
5. With `--attacks` (and `--pool`, a pool with secret cases, e.g. `env.modules=fnmatch`): the
   grading time of every red-team payload of `tests/env/test_env_redteam_secret.py` against the
   median of `--rounds` honest gradings (the reference fix) of the same task, and the worst ratio.
Results go to stdout and to `--out` (default benchmarks/results/sandbox_bench.txt).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from composer_jax.env.config import EnvConfig, SandboxBackend  # noqa: E402
from composer_jax.env.pythons import get_python  # noqa: E402
from composer_jax.env.sandbox import Limits, Sandbox, allocate_uid, resolve_backend  # noqa: E402
from composer_jax.env.tasks.pool import TaskPool  # noqa: E402
from composer_jax.env.tasks.testrun import run_tests  # noqa: E402
from composer_jax.env.tasks.validate import Scratch  # noqa: E402

STARTUP_TARGET_MS = 20.0
RUNS_TARGET = 20.0


def bench_startup(n: int, backend: SandboxBackend) -> list[float]:
    """Wall times (ms) of n sandboxed `true` commands in one workspace."""
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as tmp:
        ws = pathlib.Path(tmp, "ws")
        ws.mkdir()
        uid = allocate_uid()
        if uid is not None:
            os.chmod(tmp, 0o711)
            os.chown(ws, uid, uid)
        sb = Sandbox(ws, backend=backend, limits=Limits(), uid=uid)
        times = []
        for _ in range(n + 5):
            t = time.perf_counter()
            r = sb.run("true")
            times.append((time.perf_counter() - t) * 1000)
            assert r.exit_code == 0, r.output
        sb.close()
    return times[5:]  # the first runs warm the page cache


def bench_runs(pool: TaskPool, seconds: float, workers: int, backend, cfg,
               warm: bool) -> tuple[int, float, int]:
    """(runs, elapsed seconds, failures) of grading runs on the reference fixes, `workers` threads.

    warm=False: a fresh sandbox + interpreter per run (`run_tests`, as episodes are graded);
    warm=True: the sandboxed fork server (`TestServer`, as generation validates tasks)."""
    cfg = dataclasses.replace(cfg, fork_server=warm)
    tasks = pool.tasks()
    deadline = time.monotonic() + seconds

    snapshots: dict = {}

    def worker(k: int) -> tuple[int, int]:
        runs = fails = 0
        scratches = {}
        i = k
        while time.monotonic() < deadline:
            task = tasks[i % len(tasks)]
            i += workers
            sx = scratches.get(task.python_version)
            if sx is None:
                sx = scratches[task.python_version] = Scratch(get_python(task.python_version), backend, cfg)
            d = pool.task_dir(task.task_id)
            files = snapshots.get(task.task_id)
            if files is None:  # the whole snapshot (package tasks need all their files)
                snap = d / "snapshot"
                files = {p.relative_to(snap).as_posix(): p.read_text()
                         for p in sorted(snap.rglob("*")) if p.is_file()}
                files.update({r: (d / "solution" / r).read_text() for r in task.edit_files})
                snapshots[task.task_id] = files
            sx.sync(files)
            run = sx.run(list(task.test_ids)) if warm else \
                run_tests(sx.sandbox, sx.py.executable, list(task.test_ids), timeout_s=30)
            runs += 1
            fails += not all(run.passed(t) for t in task.test_ids)
        for sx in scratches.values():
            sx.close()
        return runs, fails

    start = time.monotonic()
    with cf.ThreadPoolExecutor(workers) as ex:
        results = list(ex.map(worker, range(workers)))
    return sum(r for r, _ in results), time.monotonic() - start, sum(f for _, f in results)


def bench_grading(pool: TaskPool, seconds: float, workers: int, cfg) -> tuple[int, float, int]:
    """(gradings, elapsed seconds, unresolved) of `grade_workspace` on reference-fixed workspaces."""
    from composer_jax.env.grading import grade_workspace
    from composer_jax.env.workspace import open_workspace
    cfg = dataclasses.replace(cfg, use_embeddings=False)
    tasks = pool.tasks()
    try:  # an env worker indexes the mounted system once, at its first episode: not timed here
        from composer_jax.env.hide import _index, mounted_roots
        for v in sorted({t.python_version for t in tasks}):
            for root in mounted_roots((get_python(v).prefix,), cfg.extra_ro_binds):
                _index(root)
    except ImportError:  # the code before the hardened grader has no index
        pass
    deadline = time.monotonic() + seconds
    busy = [0.0] * workers

    def worker(k: int) -> tuple[int, int]:
        runs = fails = 0
        i = k
        while time.monotonic() < deadline:
            task = tasks[i % len(tasks)]
            i += workers
            d = pool.task_dir(task.task_id)
            with open_workspace(d / "snapshot", cfg, python_version=task.python_version) as ws:
                for r in task.edit_files:
                    (ws.root / r).write_text((d / "solution" / r).read_text())
                t = time.monotonic()
                grade = grade_workspace(ws, task, d / "snapshot")
                busy[k] += time.monotonic() - t
            runs += 1
            fails += not grade.resolved
        return runs, fails

    with cf.ThreadPoolExecutor(workers) as ex:
        results = list(ex.map(worker, range(workers)))
    return sum(r for r, _ in results), sum(busy) / workers, sum(f for _, f in results)


_SIDE = r"""
import json, sys, time, pathlib
root = sys.argv[1]
sys.path[:0] = [root, root + "/benchmarks"]
import sandbox_bench as sb
from composer_jax.env.config import EnvConfig
from composer_jax.env.tasks.pool import TaskPool
pool = TaskPool(pathlib.Path(sys.argv[2]))
import dataclasses
from composer_jax.env.grading import grade_workspace
from composer_jax.env.workspace import open_workspace
cfg = dataclasses.replace(EnvConfig(), use_embeddings=False)
t = time.monotonic()
for task in pool.tasks():                             # one untimed grading per task (warm-up)
    d = pool.task_dir(task.task_id)
    with open_workspace(d / "snapshot", cfg, python_version=task.python_version) as ws:
        for r in task.edit_files:
            (ws.root / r).write_text((d / "solution" / r).read_text())
        grade_workspace(ws, task, d / "snapshot")
warm = time.monotonic() - t
n, busy, fails = sb.bench_grading(pool, float(sys.argv[3]), int(sys.argv[4]), EnvConfig())
print("RESULT " + json.dumps({"gradings": n, "rate": n / busy if busy else 0.0,
                              "unresolved": fails, "warmup_s": warm}))
"""


def grading_side_by_side(base: str, pool_dir: str, seconds: float, workers: int,
                         rounds: int) -> list[str]:
    """Alternates base and this tree's `bench_grading` in fresh processes (module doc, item 4)."""
    import json
    import shutil
    for d in pathlib.Path(pool_dir, "tasks").iterdir():  # no cached reference runs: time them
        shutil.rmtree(d / ".grader", ignore_errors=True)
    rows = {"base": [], "new": []}
    warm = {"base": [], "new": []}
    for k in range(rounds):  # base first in even rounds, new first in odd ones (load drifts)
        order = (("base", base), ("new", str(ROOT)))
        for side, root in (order if k % 2 == 0 else order[::-1]):
            out = subprocess.run([sys.executable, "-c", _SIDE, root, pool_dir, str(seconds),
                                  str(workers)], capture_output=True, text=True,
                                 env={**os.environ, "PYTHONPATH": root})
            line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
            if not line:
                raise RuntimeError(f"{side} grading bench failed: {out.stderr[-2000:]}")
            r = json.loads(line[-1][7:])
            rows[side].append(r)
            warm[side].append(r["warmup_s"])
    n = len(TaskPool(pathlib.Path(pool_dir)))
    head = "".join(f"  {s} run{i + 1}" for i in range(rounds) for s in ("base", "new"))
    vals = "".join(f"  {rows['base'][i]['rate']:9.2f}  {rows['new'][i]['rate']:8.2f}"
                   for i in range(rounds))
    mb = statistics.mean(r["rate"] for r in rows["base"])
    mn = statistics.mean(r["rate"] for r in rows["new"])
    return [
        f"grading side by side with {pathlib.Path(base).name} ({rounds} rounds of {seconds:g} s, "
        f"order base/new then new/base, "
        f"{workers} workers, pool {pathlib.Path(pool_dir).name}, {n} tasks; gradings/s per worker "
        f"thread, reference fix):",
        "                       " + head + "   new/base (mean)",
        "  grade_workspace/s    " + vals + f"   {mn / mb:.2f}x",
        f"  unresolved: base {sum(r['unresolved'] for r in rows['base'])}, new "
        f"{sum(r['unresolved'] for r in rows['new'])}",
        f"  untimed first pass over the {n} tasks (s): base "
        + ", ".join(f"{w:.1f}" for w in warm["base"]) + "; new "
        + ", ".join(f"{w:.1f}" for w in warm["new"])
        + " (new: the first includes each task's one-time reference run, cached afterwards)",
    ]


def attack_times(pool_dir: str, rounds: int) -> list[str]:
    """Grading seconds of each red-team payload vs honest gradings of the same task (item 5)."""
    sys.path[:0] = [str(ROOT / "tests" / "env")]
    import test_env_redteam_secret as rt
    from redteam_helpers import case_task, play_task
    pool = TaskPool(pathlib.Path(pool_dir))
    case_pool = (pool, dataclasses.replace(EnvConfig(), use_embeddings=False,
                                           python_versions=tuple(sorted(
                                               {t.python_version for t in pool.tasks()}))))
    task, d, cfg = case_task(case_pool)
    rel = task.edit_files[0]
    broken, fixed = (d / "snapshot" / rel).read_text(), (d / "solution" / rel).read_text()

    def graded(text, *more):
        ep = play_task(task, d, cfg, [("write_file", {"file_path": rel, "contents": text}), *more])
        return ep.grade

    graded(fixed)  # untimed: builds the reference and secret-case caches
    honest = [graded(fixed) for _ in range(rounds)]
    base = statistics.median(g.seconds for g in honest)
    payloads = {f"forge/{k}": v.replace("IDS", repr(list(task.test_ids)))
                for k, v in rt.FORGERS.items()}
    payloads.update({f"special/{k}": rt._DISPATCH.replace("GOOD", repr(fixed)).replace(
        "CONDITION", c) for k, c in rt.SPECIAL.items()})
    payloads.update({f"parent_work/{k}": rt._EMIT_OBS.replace("BODY", b).replace(
        "IDS", repr(list(task.test_ids))) for k, b in rt._PARENT_WORK.items()})
    payloads["endless_loop"] = "\n_f0 = fnmatch\ndef fnmatch(n, p):\n    while True:\n        pass\n"
    payloads.update({f"steer_secret/{k}": rt._STEER.replace("GOOD", repr(fixed)).replace(
        "ACTION", a) for k, a in rt.STEERING.items()})
    payloads["wrong_only_off_the_tests"] = rt._DISPATCH.replace("GOOD", repr(fixed)).replace(
        "CONDITION", f"repr((a, tuple(sorted(k.items())))) not in {rt._secret_inputs(d)!r}")
    attacks = {name: (broken + p,) for name, p in payloads.items()}
    attacks["new_modules/11MiB"] = (fixed, ("run_terminal_cmd", {
        "command": rt._PAD.format(n=6, size=1900000)}))
    lines = [f"red-team grading times on {task.task_id} ({len(task.fail_to_pass)} FAIL_TO_PASS, "
             f"{len(task.held_back)} held back; honest grading median of {rounds}: {base:.3f} s, "
             f"all resolved: {all(g.resolved for g in honest)})",
             f"  {'attack':34s} {'seconds':>8s} {'x honest':>9s}  resolved  secret  detail"]
    worst = 0.0
    for name, args in sorted(attacks.items()):
        g = graded(*args)
        worst = max(worst, g.seconds / base)
        lines.append(f"  {name:34s} {g.seconds:8.3f} {g.seconds / base:9.2f}  {str(g.resolved):8s}"
                     f"  {g.secret_passed}/{g.secret_total}  {g.detail[:60]!r}")
    lines.append(f"  worst red-team grading / honest grading: {worst:.2f}x")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pool", default="")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--startup_runs", type=int, default=200)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "sandbox_bench.txt"))
    ap.add_argument("--base", default="", help="an earlier checkout to compare grading with")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only_grading", action="store_true",
                    help="with --base: only the side-by-side grading comparison")
    ap.add_argument("--attacks", action="store_true",
                    help="with --pool: red-team grading times against honest gradings")
    args = ap.parse_args(argv)
    if args.attacks:
        if not args.pool:
            ap.error("--attacks needs --pool")
        up = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
        lines = ["composer_jax sandbox benchmark (benchmarks/sandbox_bench.py --attacks)",
                 f"machine: {os.cpu_count()} CPUs, {platform.platform()}", f"uptime before: {up}"]
        lines += attack_times(args.pool, max(args.rounds, 3))
        text = "\n".join(lines) + "\n"
        print(text, end="")
        pathlib.Path(args.out).write_text(text)
        return 0
    if args.base and args.only_grading:
        if not args.pool:
            ap.error("--only_grading needs --pool")
        up = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
        lines = ["composer_jax sandbox benchmark (benchmarks/sandbox_bench.py --base ... "
                 "--only_grading)",
                 f"machine: {os.cpu_count()} CPUs, {platform.platform()}",
                 f"uptime before: {up}"]
        lines += grading_side_by_side(args.base, args.pool, args.seconds, args.workers,
                                      args.rounds)
        lines.append("uptime after: " + subprocess.run(["uptime"], capture_output=True,
                                                       text=True).stdout.strip())
        text = "\n".join(lines) + "\n"
        print(text, end="")
        pathlib.Path(args.out).write_text(text)
        return 0
    cfg = EnvConfig()
    backend = resolve_backend(cfg.sandbox_backend)
    if args.pool:
        pool = TaskPool(pathlib.Path(args.pool))
        pool_note = f"pool {args.pool}"
    else:
        from composer_jax.env.tasks.generate import generate_pool
        tmp = tempfile.mkdtemp(prefix="cj-bench-pool-")
        generate_pool(EnvConfig(num_tasks=20, python_versions=cfg.python_versions[-1:]), pathlib.Path(tmp),
                      progress=False)
        pool = TaskPool(pathlib.Path(tmp))
        pool_note = f"freshly generated pool of {len(pool)} tasks"
    startup = bench_startup(args.startup_runs, backend)
    load_before = os.getloadavg()[0]
    runs, elapsed, fails = bench_runs(pool, args.seconds, args.workers, backend, cfg, warm=False)
    wruns, welapsed, wfails = bench_runs(pool, args.seconds, args.workers, backend, cfg, warm=True)
    gruns, gbusy, gfails = bench_grading(pool, args.seconds, args.workers, cfg)
    grate = gruns / gbusy if gbusy else 0.0
    med = statistics.median(startup)
    p90 = sorted(startup)[int(0.9 * len(startup))]
    rate = runs / elapsed
    wrate = wruns / welapsed
    bw = subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout.strip() \
        if backend == SandboxBackend.BWRAP else "none (fallback)"
    ids = sum(len(t.test_ids) for t in pool.tasks()) / max(len(pool), 1)
    lines = [
        "composer_jax sandbox benchmark (benchmarks/sandbox_bench.py)",
        f"machine: {os.cpu_count()} CPUs, {platform.platform()}, python {platform.python_version()}, {bw}",
        f"backend: {backend.value}; workers: {args.workers}; tasks: {pool_note} "
        f"({len(pool)} tasks, {ids:.1f} test ids per grading run on average)",
        "",
        f"sandbox start-up (n={len(startup)}): median {med:.2f} ms, p90 {p90:.2f} ms, "
        f"min {min(startup):.2f} ms, max {max(startup):.2f} ms",
        f"  target median <= {STARTUP_TARGET_MS:.0f} ms: {'PASS' if med <= STARTUP_TARGET_MS else 'FAIL'} "
        f"(target / measured = {STARTUP_TARGET_MS / med:.2f}x)",
        f"sandboxed test runs, cold (fresh sandbox + interpreter per run, as grading): {runs} runs "
        f"in {elapsed:.1f} s = {rate:.1f} runs/s ({fails} runs with a failing test)",
        f"  target >= {RUNS_TARGET:.0f} runs/s: {'PASS' if rate >= RUNS_TARGET else 'FAIL'} "
        f"(measured / target = {rate / RUNS_TARGET:.2f}x)",
        f"sandboxed test runs, warm (sandboxed fork server, as generation): {wruns} runs in "
        f"{welapsed:.1f} s = {wrate:.1f} runs/s ({wfails} runs with a failing test)",
        f"  target >= {RUNS_TARGET:.0f} runs/s: {'PASS' if wrate >= RUNS_TARGET else 'FAIL'} "
        f"(measured / target = {wrate / RUNS_TARGET:.2f}x)",
        f"grading (grade_workspace on the reference fix, as an episode ends; workspace opening not "
        f"timed): {gruns} gradings, {grate:.1f} gradings/s per worker thread x {args.workers} "
        f"({gfails} unresolved)",
        f"1-minute load average before the run: {load_before:.2f} on {os.cpu_count()} CPUs "
        f"(other jobs share this machine; numbers degrade with load)",
    ]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(text)
    ok = (med <= STARTUP_TARGET_MS and max(rate, wrate) >= RUNS_TARGET
          and fails + wfails + gfails == 0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
