"""The evaluation runner: every suite task x prompt style x K samples, episodes run concurrently.

`run_suite(suite, policy, env_cfg, settings)` returns flat episode records (`episode_record`); the
report module aggregates them. Jobs are ordered task by task, so with `concurrency >= samples *
len(styles)` the K samples of a task run at once. Each episode runs through the policy's loop
(`Policy.episode`: the environment's text loop for reference agents, the RL token-level agent on
the engine service for models) and the environment's own grader, so an evaluation is scored
exactly as RL rewards are.
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import re

from tqdm.auto import tqdm

from composer_jax.env.config import EnvConfig
from composer_jax.env.rewards import claims_success
from composer_jax.env.tasks.task import read_files
from composer_jax.eval.episodes import EpisodeFacts
from composer_jax.eval.metrics import episode_price, regressions
from composer_jax.eval.quality import quality
from composer_jax.eval.suite import Suite, SuiteTask

_TEST_CMD = re.compile(r"unittest|pytest|\btest_\w+|runtests")


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """What one evaluation runs: samples per (task, style), styles, concurrency, limits, prices."""
    samples: int = 1
    styles: tuple[str, ...] = ("terse", "detailed")
    concurrency: int = 2
    num_tasks: int = 0                    # 0 = every task of the suite
    price_prompt_per_mtok: float = 0.5
    price_cached_per_mtok: float = 0.05
    price_generated_per_mtok: float = 2.5
    seed: int = 0


def ran_tests_before_finish(calls: list[dict]) -> bool:
    """True if a successful terminal command that runs tests precedes the episode's end."""
    return any(c["name"] == "run_terminal_cmd" and not c.get("is_error")
               and _TEST_CMD.search(str((c.get("arguments") or {}).get("command", "")))
               for c in calls)


def episode_record(st: SuiteTask, style: str, sample: int, f: EpisodeFacts,
                   settings: RunSettings) -> dict:
    """One flat record (numbers and short strings) of a finished episode."""
    task = st.task
    snapshot = read_files(st.task_dir / "snapshot", (*task.edit_files, *task.test_files))
    q = quality(snapshot, f.calls, f.changed_files, task.edit_files, task.test_files,
                task.lines_changed)
    p2p = list(task.pass_to_pass)
    after = {t: ("fail" if t in f.p2p_failed else "pass") for t in p2p}
    regressed = regressions({t: "pass" for t in p2p}, after, p2p)
    claim = claims_success(f.final_message)
    price = episode_price(f.prompt_tokens, f.cached_prompt_tokens, f.generated_tokens,
                          prompt_per_mtok=settings.price_prompt_per_mtok,
                          cached_per_mtok=settings.price_cached_per_mtok,
                          generated_per_mtok=settings.price_generated_per_mtok)
    return {
        "task_id": task.task_id, "category": st.category, "kind": task.kind, "style": style,
        "sample": sample, "lines_changed": st.lines_changed,
        # correctness
        "resolved": bool(f.resolved), "partial": f.partial,
        "f2p_passed": f.f2p_passed, "f2p_total": f.f2p_total,
        "p2p_passed": f.p2p_passed, "p2p_total": f.p2p_total,
        "regressions": len(regressed), "regressed_tests": regressed[:10],
        "grader_ok": bool(f.grader_ok),
        # quality
        **q,
        # cost
        "generated_tokens": f.generated_tokens, "prompt_tokens": f.prompt_tokens,
        "cached_prompt_tokens": f.cached_prompt_tokens, "tool_calls": f.num_calls,
        "turns": f.turns, "wall_s": f.wall_s, "price": price,
        # behaviour
        "invalid_calls": f.num_invalid_calls,
        "tests_run_before_finish": ran_tests_before_finish(list(f.calls)),
        "claims_success": claim, "false_claim": bool(claim and not f.resolved),
        "final_message_chars": len(f.final_message), "finished": f.stop_reason == "finish",
        "stop_reason": f.stop_reason, "reward": f.reward, "crashed": f.error is not None,
    }


def run_suite(suite: Suite, policy, env_cfg: EnvConfig, settings: RunSettings,
              progress: bool = True, on_record=None) -> list[dict]:
    """Runs every (task, style, sample) episode; returns the records in a fixed order."""
    tasks = list(suite.tasks[:settings.num_tasks] if settings.num_tasks else suite.tasks)
    jobs = [(st, style, k) for st in tasks for style in settings.styles for k in range(settings.samples)]

    def one(job):
        st, style, k = job
        task = dataclasses.replace(st.task, problem_statement=st.prompts[style])
        facts = policy.episode(task, st.task_dir, env_cfg, settings.seed + k)
        return episode_record(st, style, k, facts, settings)

    records = [None] * len(jobs)
    with cf.ThreadPoolExecutor(max(1, settings.concurrency)) as ex:
        futs = {ex.submit(one, j): i for i, j in enumerate(jobs)}
        for fut in tqdm(cf.as_completed(futs), total=len(futs), desc=f"eval {policy.name}",
                        disable=not progress):
            i = futs[fut]
            records[i] = fut.result()
            if on_record is not None:
                on_record(records[i])
    return records
