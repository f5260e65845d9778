"""How long each experiment of `python launch.py --experiment=list` takes on this CPU: one
`launch.py` run per experiment, each in a fresh workdir with a fresh empty cache (what a fresh clone
pays the first time), timed wall-clock and in CPU seconds (user + sys of the whole process tree).

An experiment runs at its default setting when that fits the time we can spend here (~3 min);
otherwise at a short setting (SHORT below, marked `short` with its flags), the pods-only
experiments as --dry_run, and one that cannot run without a setting with it (NEEDS, `needs`).
Rows are merged into the results file by name, so experiments can be (re)timed a few at a time:

    python benchmarks/experiment_times.py                      # every experiment
    python benchmarks/experiment_times.py cpt_debug generate   # only these (other rows kept)

writes benchmarks/results/experiment_times.txt; `launch.py --experiment=list` cites it.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import resource
import signal
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "experiment_times.txt"
sys.path.insert(0, str(ROOT))
from composer_jax import registry  # noqa: E402

# experiments whose default takes far longer than a few minutes on CPU (or needs pods): the
# setting timed instead. Everything else is timed at its default.
DRY = ("--dry_run", "--config.mesh.num_devices=256")
SHORT = {
    "cpt_32k": DRY,
    "cpt_256k": DRY,
    "cpt_small": ("--config.train.steps=10", "--config.train.warmup_steps=1",
                  "--config.train.eval_every=10",
                  "--config.train.checkpoint_every=10"),
    "sft": ("--config.train.steps=4", "--config.train.eval_every=4",
            "--config.train.checkpoint_every=4", "--config.train.warmup_steps=1"),
    "lowprec_loss_gap": ("--config.train.steps=10", "--config.train.warmup_steps=1",
                         "--config.train.eval_every=10", "--config.train.checkpoint_every=10"),
    "cpt_rl_sweep": ("--config.sweep.budgets=4,8", "--config.sweep.seeds=0",
                     "--config.sweep.cpt_set=train.warmup_steps=1",
                     "--config.rl.steps=4", "--config.train.steps=4",
                     "--config.rl.job.eval_every=4", "--config.rl.job.checkpoint_every=4"),
    "rl_async": ("--config.rl.steps=10",),
    "rl_sync": ("--config.rl.steps=10",),
    "rl_async_parity": ("--config.rl.steps=10",),
    "rl_async_coding": ("--config.rl.steps=2",),
}
# experiments that need a setting to run at all: timed with it (marked `needs`)
NEEDS = {
    "eval_compare": ("--config.eval.compare=benchmarks/results/eval_oracle.json,"
                     "benchmarks/results/eval_null.json",),
}
HEADER = """\
# launch.py experiments timed on a 2-core CPU (JAX_PLATFORMS=cpu): python benchmarks/experiment_times.py
# each run from a fresh clone's state: a fresh workdir and a fresh empty cache (COMPOSER_JAX_CACHE),
# so first-run costs (tokenizer, corpus, lookup SFT, compilation) are included.
# setting: default = the experiment as `list` runs it; short = the flags shown (the default takes
# much longer on CPU); needs = the default with the flags it cannot run without; dry_run =
# --dry_run (the experiment itself needs a pod).
# wall_s: wall clock; cpu_s: user+sys CPU seconds of the process tree; load: 1-min load average at
# the start (the machine was shared, so wall_s is an upper bound for an idle 2-core machine).
# rc: launch.py's exit status (124: stopped at the time limit; cpu_s then misses the CPU time of
# processes still running under it).
# name | setting | wall_s | cpu_s | load | rc | flags
"""


def read_rows(text: str) -> dict[str, str]:
    """The rows of a results file by experiment name (launch.py's `list` reads the same table)."""
    return {ln.split(" | ")[0]: ln for ln in text.splitlines()
            if ln.strip() and not ln.startswith("#")}


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def time_one(name: str, limit_s: float) -> dict:
    """Runs `launch.py --experiment=NAME` with its setting; returns its row."""
    flags = SHORT.get(name, ()) or NEEDS.get(name, ())
    setting = ("dry_run" if "--dry_run" in flags else "needs" if name in NEEDS
               else "short" if flags else "default")
    with tempfile.TemporaryDirectory(prefix=f"times_{name}_") as tmp:
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "COMPOSER_JAX_CACHE": f"{tmp}/cache",
               "PYTHONPATH": str(ROOT)}
        cmd = [sys.executable, "launch.py", f"--experiment={name}", f"--workdir={tmp}/run", *flags]
        load = os.getloadavg()[0]
        cpu0, t0 = _child_cpu(), time.monotonic()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=limit_s)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            rc = 124
        wall, cpu = time.monotonic() - t0, _child_cpu() - cpu0
    if rc != 0:
        print(f"--- {name} rc={rc}, last output:\n{out[-3000:]}", file=sys.stderr)
    return {"name": name, "setting": setting, "wall_s": wall, "cpu_s": cpu, "load": load,
            "rc": rc, "flags": " ".join(flags) or "-"}


def _line(r: dict) -> str:
    return (f"{r['name']} | {r['setting']} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | "
            f"{r['load']:.2f} | {r['rc']} | {r['flags']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="experiments to time (default: all)")
    ap.add_argument("--limit_s", type=float, default=900.0, help="stop a run after this long")
    args = ap.parse_args()
    names = args.names or sorted(registry.load_all())
    for name in names:
        registry.get(name)                      # an unknown name fails before anything runs
    for name in names:
        line = _line(time_one(name, args.limit_s))
        print(line, flush=True)
        lines = {**(read_rows(OUT.read_text()) if OUT.exists() else {}), name: line}
        OUT.write_text(HEADER + "".join(lines[n] + "\n" for n in sorted(lines)))
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
