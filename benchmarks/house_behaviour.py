"""Issue 43's "behaviour unchanged": the README main command on two commits, the same run?

    python benchmarks/house_behaviour.py [--base COMMIT] [--head COMMIT] [--cache_from DIR]
        [--head_set KEY=VALUE ...]

--head_set adds `--config.KEY=VALUE` to head's command only: a later commit that changed the
recipe's defaults (issue 40: rl.task.sft_steps, sft_hasty, sft_schedule, train.lr) is compared
with the base on the base's recipe.

Clones the repository twice (at --base, default the first commit that has the reproducible
schedule `composer_jax/rl/schedule.py`, and at --head, default HEAD), runs
`python launch.py --experiment=rl_async` in each (defaults: seed 0, rl.schedule=reproducible),
each with its own data cache (the lookup SFT policy's cache key hashes the code, so each side
trains its own version 0; --cache_from copies only the corpus, tokenizer and token shards), and
compares the runs with head's `python -m composer_jax.rl.run_compare` (metrics.jsonl rows per
step without wall-clock fields, the consumed log, the final checkpoint's arrays) plus a field
listing of its own. Writes benchmarks/results/house_behaviour.txt.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "house_behaviour.txt"
COMMAND = ["launch.py", "--experiment=rl_async"]
SHARED_CACHE = ("corpus", "tokenizer", "tokens")      # code-independent; never lookup_sft


def _git(*args: str, cwd: pathlib.Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def first_schedule_commit() -> str:
    return _git("log", "--diff-filter=A", "--format=%H", "--",
                "composer_jax/rl/schedule.py").splitlines()[-1]


def run_side(name: str, commit: str, tmp: pathlib.Path, cache_from: str | None,
             flags: tuple[str, ...] = ()) -> dict:
    clone = tmp / f"clone_{name}"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    _git("checkout", "-q", commit, cwd=clone)
    cache = tmp / f"cache_{name}"
    cache.mkdir()
    for sub in SHARED_CACHE if cache_from else ():
        if (pathlib.Path(cache_from) / sub).is_dir():
            shutil.copytree(pathlib.Path(cache_from) / sub, cache / sub)
    workdir = tmp / f"run_{name}"
    env = dict(os.environ, PYTHONPATH=str(clone), JAX_PLATFORMS="cpu",
               COMPOSER_JAX_CACHE=str(cache))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, *COMMAND, f"--workdir={workdir}", *flags], cwd=clone, env=env,
                          capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{name} ({commit[:10]}) failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    summary = [ln.strip() for ln in proc.stdout.splitlines()
               if ln.startswith(("rl_async:", "  train reward"))]
    return {"commit": _git("rev-parse", "HEAD", cwd=clone), "clone": clone, "workdir": workdir,
            "wall_s": round(time.monotonic() - t0), "summary": summary}


def field_report(a: pathlib.Path, b: pathlib.Path, timey) -> list[str]:
    def rows(d):
        return [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if x.strip()]
    ra, rb = rows(a), rows(b)
    keys_a, keys_b = set().union(*ra), set().union(*rb)
    diff = sorted({k for x, y in zip(ra, rb) for k in x if k in y and x[k] != y[k]})
    return [f"metrics.jsonl rows: {len(ra)} vs {len(rb)}; fields {len(keys_a)} vs {len(keys_b)}"
            f" (only base: {sorted(keys_a - keys_b)}, only head: {sorted(keys_b - keys_a)})",
            f"fields whose values differ in some row: wall-clock {[k for k in diff if timey(k)]}; "
            f"others {[k for k in diff if not timey(k)]}"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default=None)
    ap.add_argument("--head", default="HEAD")
    ap.add_argument("--cache_from", default=None)
    ap.add_argument("--head_set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    base = _git("rev-parse", args.base or first_schedule_commit())
    head = _git("rev-parse", args.head)
    with tempfile.TemporaryDirectory(prefix="house_behaviour_") as t:
        tmp = pathlib.Path(t)
        head_flags = tuple(f"--config.{kv}" for kv in args.head_set)
        sides = {name: run_side(name, commit, tmp, args.cache_from, flags)
                 for name, commit, flags in (("base", base, ()), ("head", head, head_flags))}
        cmp = subprocess.run([sys.executable, "-m", "composer_jax.rl.run_compare",
                              str(sides["base"]["workdir"]), str(sides["head"]["workdir"])],
                             cwd=sides["head"]["clone"], capture_output=True, text=True,
                             env=dict(os.environ, PYTHONPATH=str(sides["head"]["clone"]),
                                      JAX_PLATFORMS="cpu"))
        sys.path.insert(0, str(sides["head"]["clone"]))
        from composer_jax.rl.run_compare import _timey
        fields = field_report(sides["base"]["workdir"], sides["head"]["workdir"], _timey)
    said = cmp.stdout.strip().splitlines() or ["(no output)"]
    verdict = "identical" if said == ["identical"] else f"{len(said)} differences"
    lines = [f"README main command (python launch.py --experiment=rl_async; defaults: seed 0, "
             f"rl.schedule=reproducible) on base {base[:10]} vs head {head[:10]}: run_compare says "
             f"{verdict!r}",
             f"command: python benchmarks/house_behaviour.py --base {base[:10]} --head {head[:10]}"
             + (" --cache_from DIR (corpus, tokenizer, token shards only)" if args.cache_from else "")
             + "".join(f" --head_set {kv}" for kv in args.head_set),
             f"base {base} (first commit with composer_jax/rl/schedule.py): "
             f"{_git('log', '-1', '--format=%s', base)[:100]}",
             f"head {head}: {_git('log', '-1', '--format=%s', head)[:100]}",
             "each side: a fresh clone, its own data cache (its own lookup SFT version 0: the cache "
             "key hashes the code), one process after the other on the same machine",
             f"run_compare (metrics.jsonl per step without wall-clock fields, consumed log, final "
             f"checkpoint arrays bit for bit): {verdict}"
             + ("" if cmp.returncode == 0 else f" (exit {cmp.returncode})"),
             *([] if verdict == "identical" else ["  " + x for x in said]), *fields]
    for name, side in sides.items():
        lines.append(f"{name} wall {side['wall_s']} s: " + " | ".join(side["summary"]))
    OUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if cmp.returncode == 0 and verdict == "identical" else 1


if __name__ == "__main__":
    sys.exit(main())
