"""Episodes/s of the coding family's environment on ladder tasks: scripted oracle episodes.

Each episode is `agent.episode.run_episode` with the ladder's scripted oracle
(`env.tasks.ladder_plan.LadderOracleAgent`: run the tests, read the failure (and the broken line's
window where the output does not show it), the reference fix through the tools, run the tests, finish) in a fresh bubblewrap sandbox over the task's snapshot, graded by
the environment's grader -- everything of a coding RL episode but the policy's tokens (the SFT data
of `data/sft_env.py` is made of exactly these episodes). The same tasks run with 1 thread, then
with `--threads` threads, in one process (absolute times on a shared 2-core machine mean little;
the two rates are measured side by side).

    PYTHONPATH=$PWD python benchmarks/coding_ladder.py --pool POOL --level 1 --episodes 12
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import pathlib
import statistics
import time

from composer_jax.agent.episode import run_episode
from composer_jax.env.config import EnvConfig
from composer_jax.env.tasks.ladder_generate import level_kind
from composer_jax.env.tasks.ladder_plan import oracle_agent
from composer_jax.env.tasks.pool import TaskPool


def episodes(pool: TaskPool, tasks, threads: int, cfg: EnvConfig) -> tuple[float, list]:
    """(wall seconds, episodes) of one oracle episode per task on `threads` threads."""
    def one(task):
        d = pool.task_dir(task.task_id)
        return run_episode(oracle_agent(task, d), task, d, cfg)

    start = time.monotonic()
    with cf.ThreadPoolExecutor(threads) as ex:
        eps = list(ex.map(one, tasks))
    return time.monotonic() - start, eps


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pool", required=True)
    ap.add_argument("--level", type=int, default=1)
    ap.add_argument("--episodes", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--split", default="train")
    a = ap.parse_args(argv)
    pool = TaskPool(pathlib.Path(a.pool))
    tasks = [t for t in pool.tasks() if t.kind == level_kind(a.level) and t.split == a.split]
    tasks = tasks[:a.episodes]
    cfg = EnvConfig(use_embeddings=False)
    out = {"level": a.level, "split": a.split, "episodes": len(tasks)}
    _, (warm,) = episodes(pool, tasks[:1], 1, cfg)   # untimed: page cache and imports
    out["example"] = {"task_id": warm.task_id, "calls": [c["name"] for c in warm.calls],
                      "first_output_tail": warm.calls[0]["output"][-400:]}
    for threads in (1, a.threads):
        wall, eps = episodes(pool, tasks, threads, cfg)
        out[f"threads_{threads}"] = {
            "wall_s": round(wall, 2), "episodes_per_s": round(len(eps) / wall, 3),
            "resolved": sum(bool(e.grade.resolved) for e in eps),
            "tampered": sum(bool(e.grade.tampered) for e in eps),
            "median_episode_s": round(statistics.median(e.duration_s for e in eps), 2),
            "mean_tool_calls": round(statistics.mean(e.num_calls for e in eps), 2)}
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
