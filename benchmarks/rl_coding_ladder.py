"""Level-1 coding ladder RL runs (issue 41): held-out resolved per evaluated version, pooled over seeds,
plus the disjointness of held-out modules from every training row actually used.

    python benchmarks/rl_coding_ladder.py RUN [RUN ...] [--pool POOL] [--sft SFT_RUN] [--out FILE]
    python benchmarks/rl_coding_ladder.py --policy POLICY --config RUN [--split eval|train]
                                          [--greedy] [--tasks N] [--samples K] [--kinds K,..] [--show K]
    python benchmarks/rl_coding_ladder.py --policy POLICY --demos --pool POOL [--split eval|train] [--tasks N]
                                          [--show K] [--attention]
    python benchmarks/rl_coding_ladder.py --policy POLICY --copy_probe

For each RUN (an `rl_async --set rl.task=coding --set rl.task.levels=1` workdir): the held-out
evaluation rows of metrics.jsonl (`rl.evaluators.EvaluatorService`: one episode per held-out task,
sampled at rl.temperature with rl.eval_greedy=false) with resolved +- SE over tasks, valid-call rate,
turns, generated tokens, outcome classes (`rl.batch_metrics.outcome_class`), episodes the grader
flagged as tampering and resolved per level and mutation kind (the `eval_level1_name_typo_...` rows);
the training groups by outcome (none / all / some resolved) and, in groups where none resolved, the
correlation of the advantage with the episode's turns (what the reward's behaviour terms teach);
the training rows' totals (episodes, tampered, valid-call rate first/last third) and the run's
rollouts/s (rl_summary.json). Pooled over runs: the mean of the per-run first
and last evaluations, SE = sqrt(sum SE_i^2) / n, z = (last - first) / sqrt(SE_first^2 + SE_last^2).

With --policy (a run workdir, WORKDIR@V, or the SFT run): that policy's episodes on N tasks of the
split (held-out `eval` or `train`) with RUN's config (its family, pool and engine settings; the
prompt, env.prompt_tools / env.declare_tools, is the policy's own run's) through the real agent, sandbox and grader (`rl.family_eval.FamilyEvaluator`'s engine), greedy or sampled at
rl.temperature, --samples K episodes per task; prints resolved +- SE, valid-call rate, outcome classes,
resolved per mutation kind and (K > 1) how many tasks K episodes resolved none, some or all of.

With --policy, --demos and --pool: `demo_scores`, the policy's teacher-forced CE and argmax accuracy
per assistant token on the oracle demonstrations of N tasks of the split (no generation); --show K
prints the first K edit calls token by token, each miss with the argmax and the target's probability;
per argument, how often its value's first token is the argmax; --attention adds, per layer, where the
heads look at those tokens (an earlier copy of the token to write, the token before one, which tokens).

With --policy and --copy_probe: `copy_probe`, the policy's CE on the first and second copy of repeated
random token sequences (does it copy from its context at all).

With --pool and --sft: `env.tasks.ladder_disjoint` signatures of the pool's held-out modules
searched in every SFT sample of SFT_RUN (its cached oracle store) and in the token ids of every
training rollout the runs logged (rollouts/); any hit is printed and makes the exit status 1.
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import re
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from composer_jax.rl.batch_metrics import OUTCOMES  # noqa: E402
from composer_jax.data.special_tokens import ALL_SPECIAL_TOKENS  # noqa: E402
from composer_jax.data.chat import VALUE_START  # noqa: E402

SHORT = {"resolved": "res", "finish_no_edit": "fin_noedit", "finish_wrong_edit": "fin_wrong",
         "no_finish_edited": "nofin_edit", "no_finish_no_edit": "nofin_noedit", "error": "err"}


def rows_of(workdir: pathlib.Path) -> list[dict]:
    path = workdir / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x] if path.exists() else []


def evals_of(rows: list[dict]) -> list[dict]:
    """The held-out evaluation rows by version (the newest row of each version)."""
    by = {int(r["step"]): r for r in rows if "eval_resolved_se" in r}
    return [by[k] for k in sorted(by)]


def train_of(rows: list[dict]) -> list[dict]:
    by = {int(r["step"]): r for r in rows if "loss" in r and "resolved_rate" in r}
    return [by[k] for k in sorted(by)]


def run_report(workdir: pathlib.Path) -> tuple[list[str], dict]:
    rows = rows_of(workdir)
    evals, train = evals_of(rows), train_of(rows)
    summary = {}
    if (workdir / "rl_summary.json").exists():
        summary = json.loads((workdir / "rl_summary.json").read_text())
    out = [f"run {workdir}"]
    head = ["version", "tasks", "resolved", "+-SE", "valid", "turns", "gen_tok", "tampered"]
    head += [SHORT[c] for c in OUTCOMES]
    out.append("  " + " ".join(f"{h:>11}" for h in head))
    for r in evals:
        n = next((v for k, v in r.items() if k.endswith("_num_tasks")), 0)
        vals = [int(r["step"]), int(n),
                r["eval_resolved_rate"], r["eval_resolved_se"], r.get("eval_valid_call_rate", math.nan),
                r.get("eval_turns_mean", math.nan), r.get("eval_generated_tokens_mean", math.nan),
                int(r.get("eval_tampered", -1))]
        vals += [int(r.get(f"eval_outcome_{c}", -1)) for c in OUTCOMES]
        out.append("  " + " ".join(f"{x:>11}" if isinstance(x, int) else f"{x:>11.3f}" for x in vals))
    kinds = sorted({k[len("eval_"):-len("_count")] for r in evals for k in r
                    if k.startswith("eval_level") and k.endswith("_count")})
    for kind in kinds:     # per-kind rows (`rl.tasks.coding` labels ladder episodes; older runs have none)
        out.append(f"    {kind}: " + ", ".join(
            f"v{int(r['step'])} {round(r[f'eval_{kind}_resolved_rate'] * r[f'eval_{kind}_count'])}/"
            f"{int(r[f'eval_{kind}_count'])}" for r in evals if f"eval_{kind}_count" in r))
    info = {"evals": [{k: r.get(k) for k in ("step", "eval_resolved_rate", "eval_resolved_se")} for r in evals]}
    if train:
        third = max(1, len(train) // 3)
        from composer_jax.rl.stream import RolloutLog
        eps = sum(len(row["rollout_ids"]) for row in RolloutLog(workdir / "rollouts").consumed_rows())
        tampered = sum(r.get("tampered", 0.0) for r in train)
        vr = lambda rs: float(np.mean([r["valid_call_rate"] for r in rs if "valid_call_rate" in r]))  # noqa: E731
        res = lambda rs: float(np.mean([r["resolved_rate"] for r in rs]))  # noqa: E731
        out.append(f"  training: {len(train)} versions, episodes {eps or 'n/a'}, tampered {int(tampered)}; "
                   f"train resolved first/last third {res(train[:third]):.3f} -> {res(train[-third:]):.3f}, "
                   f"valid-call rate {vr(train[:third]):.3f} -> {vr(train[-third:]):.3f}, turns "
                   f"{np.mean([r.get('turns_mean', math.nan) for r in train[:third]]):.2f} -> "
                   f"{np.mean([r.get('turns_mean', math.nan) for r in train[-third:]]):.2f}, gen tokens "
                   f"{np.mean([r.get('generated_tokens_mean', math.nan) for r in train[:third]]):.1f} -> "
                   f"{np.mean([r.get('generated_tokens_mean', math.nan) for r in train[-third:]]):.1f}")
        info.update(train_versions=len(train), train_tampered=tampered)
        line, info["groups"] = group_report(workdir)
        out.append(line)
    if summary:
        tot = summary.get("totals", summary)
        out.append(f"  wall {tot.get('elapsed_s', math.nan):.0f} s in the RL loop, rollouts/s "
                   f"{tot.get('rollouts_per_sec', math.nan):.3f} (training episodes; held-out ones not counted)")
        info.update(elapsed_s=tot.get("elapsed_s"), rollouts_per_sec=tot.get("rollouts_per_sec"))
    return out, info


def group_report(workdir: pathlib.Path) -> tuple[str, dict]:
    """The training groups by their episodes' outcomes (none / all / some resolved: only a mixed
    group carries a resolved advantage), and in groups where none resolved, how the reward the
    run trained with (`rl/trained_reward.py`, the run's rl.behaviour_reward) ranks the episodes:
    the mean Pearson r of (reward - group mean) against the episode's turns over the groups with
    more than one turn count and any spread in reward (negative: shorter is better)."""
    from composer_jax.api import load_config
    from composer_jax.rl.batch_metrics import resolved_of
    from composer_jax.rl.rollout import Rollout
    from composer_jax.rl.stream import RolloutLog
    from composer_jax.rl.trained_reward import trained_rewards

    behaviour = load_config(workdir / "config.json").rl.behaviour_reward
    groups: dict[str, list] = {}
    for item in RolloutLog(workdir / "rollouts").scan():
        r = Rollout.load(item.path)
        groups.setdefault(item.group_id, []).append(r)
    counts = {"none": 0, "all": 0, "mixed": 0}
    rs = []
    for eps in groups.values():
        res = [resolved_of(r) > 0 for r in eps]
        counts["none" if not any(res) else "all" if all(res) else "mixed"] += 1
        if not any(res) and len(eps) > 1:
            reward = trained_rewards(eps, behaviour)
            turns = np.array([r.info.get("num_turns", 0) for r in eps], float)
            if reward.std() > 0 and turns.std() > 0:
                rs.append(float(np.corrcoef(reward - reward.mean(), turns)[0, 1]))
    r_mean = float(np.mean(rs)) if rs else math.nan
    return (f"  groups: {len(groups)}, none resolved {counts['none']}, all {counts['all']}, mixed "
            f"{counts['mixed']}; in none-resolved groups r(advantage, turns) = {r_mean:.2f} over {len(rs)} "
            f"groups ({float(np.mean(np.array(rs) < 0)) if rs else math.nan:.0%} negative; trained "
            f"rewards, rl.behaviour_reward={behaviour.value})",
            {**counts, "fail_groups_r_turns": r_mean, "fail_groups_with_r": len(rs)})


def pass_rates(runs: list[pathlib.Path], max_version: int) -> dict[str, tuple[int, int]]:
    """task id -> (resolved, episodes) over the training rollouts of `runs` whose first token was
    sampled by a policy version <= max_version."""
    from composer_jax.rl.batch_metrics import resolved_of
    from composer_jax.rl.rollout import Rollout
    from composer_jax.rl.stream import RolloutLog

    out: dict[str, list[int]] = {}
    for run in runs:
        for item in RolloutLog(run / "rollouts").scan():
            r = Rollout.load(item.path)
            used = r.versions_used()
            if used is None or used[0] > max_version:
                continue
            c = out.setdefault(r.task_id, [0, 0])
            c[0] += int(resolved_of(r) > 0)
            c[1] += 1
    return {t: (c[0], c[1]) for t, c in sorted(out.items())}


def pass_rate_file(runs: list[pathlib.Path], max_version: int, keep: str) -> tuple[str, list[str]]:
    """(text of an rl.task.train_tasks_file, summary lines): the training tasks of `runs` whose
    pass rate is in (0, 1) (keep=mixed) or > 0 (keep=resolved), with the rates as comments."""
    rates = pass_rates(runs, max_version)
    want = ((lambda k, n: 0 < k < n) if keep == "mixed" else (lambda k, n: k > 0))
    kept = [t for t, (k, n) in rates.items() if want(k, n)]
    head = [f"# training tasks with pass rate {'in (0, 1)' if keep == 'mixed' else '> 0'} over the "
            f"rollouts of {', '.join(str(r) for r in runs)}"
            + (f" sampled by policy versions <= {max_version}" if max_version < 10**9 else ""),
            f"# {len(kept)} of {len(rates)} tasks seen; per task: resolved/episodes"]
    body = [f"{t}  # {rates[t][0]}/{rates[t][1]}" for t in kept]
    n_all = [k for k, n in rates.values()]
    summary = [f"pass rates: {len(rates)} tasks, {sum(n for _, n in rates.values())} episodes; "
               f"resolved never {n_all.count(0)}, always "
               f"{sum(1 for k, n in rates.values() if k == n)}, kept ({keep}) {len(kept)}"]
    return "\n".join(head + body) + "\n", summary


def pooled(infos: list[dict]) -> tuple[str, dict]:
    firsts = [i["evals"][0] for i in infos if len(i["evals"]) >= 2]
    lasts = [i["evals"][-1] for i in infos if len(i["evals"]) >= 2]
    if not firsts:
        return "pooled: no run with two evaluations", {}
    n = len(firsts)
    a = float(np.mean([r["eval_resolved_rate"] for r in firsts]))
    b = float(np.mean([r["eval_resolved_rate"] for r in lasts]))
    sa = math.sqrt(sum(r["eval_resolved_se"] ** 2 for r in firsts)) / n
    sb = math.sqrt(sum(r["eval_resolved_se"] ** 2 for r in lasts)) / n
    z = (b - a) / math.hypot(sa, sb) if math.hypot(sa, sb) > 0 else math.nan
    vs = ", ".join(f"v{r['step']}->v{s['step']}" for r, s in zip(firsts, lasts))
    return (f"pooled over {n} run(s) ({vs}): held-out resolved {a:.3f} +- {sa:.3f} -> {b:.3f} +- {sb:.3f}, "
            f"z = {z:.2f}"), {"runs": n, "first": a, "first_se": sa, "last": b, "last_se": sb, "z": z}


def disjoint(pool_dir: str, sft_run: str, runs: list[pathlib.Path]) -> tuple[list[str], int]:
    """Held-out module signatures searched in the SFT samples and the runs' training rollouts."""
    from composer_jax.api import load_config
    from composer_jax.data.sft_env import build_or_load_env_sft
    from composer_jax.data.tokenizer import load_tokenizer
    from composer_jax.env.tasks.ladder_disjoint import find_leaks, heldout_signatures
    from composer_jax.env.tasks.pool import TaskPool
    from composer_jax.rl.rollout import Rollout
    from composer_jax.rl.stream import RolloutLog, group_of

    sft = pathlib.Path(sft_run)
    tok = load_tokenizer(sft / "tokenizer.json")
    sigs = heldout_signatures(TaskPool(pathlib.Path(pool_dir)), tok.encode)
    store = build_or_load_env_sft(load_config(sft / "config.json").data, tok)
    sft_rows = [store.doc(i).tolist() for i in range(store.num_docs)]
    out = [f"disjointness (env.tasks.ladder_disjoint): {sum(len(s) for s in sigs.values())} signatures of "
           f"{len(sigs)} held-out modules ({', '.join(sorted(sigs))})"]
    leaks = find_leaks(sft_rows, sigs)
    out.append(f"  SFT samples of {sft}: {len(sft_rows)} rows, {sum(map(len, sft_rows))} tokens, leaks {len(leaks)}")
    # the check can fail: the held-out tasks' own statements carry their module's file name
    held = [tok.encode(t.problem_statement) for t in TaskPool(pathlib.Path(pool_dir)).tasks() if t.split == "eval"]
    out.append(f"  (control: held-out tasks' own statements hit {len({m for _, m, _ in find_leaks(held, sigs)})} "
               f"of {len(sigs)} modules)")
    total = len(leaks)
    for run in runs:
        log = RolloutLog(run / "rollouts")
        rows = []
        for row in log.consumed_rows():
            for rid in row["rollout_ids"]:
                r = Rollout.load(log.record_path(group_of(rid), rid))
                rows += [s.tokens.tolist() for s in r.segments]
        hits = find_leaks(rows, sigs)
        out.append(f"  RL training rollouts of {run}: {len(rows)} segments, leaks {len(hits)}")
        total += len(hits)
    return out, total


def _policy_run(policy: str):
    """(run directory, its Config) of a policy given as WORKDIR or WORKDIR@STEP."""
    from composer_jax.rl.family_eval import run_config
    from composer_jax.train.run_checkpoint import parse_run_source

    return pathlib.Path(parse_run_source(policy)[0]), run_config(policy)


def policy_prompt(env, policy_dir: pathlib.Path):
    """`env` with the prompt the policy's run used (its config's env.prompt_tools and
    env.declare_tools: an SFT run's samples, an RL run's adopted prompt)."""
    import dataclasses

    from composer_jax.api import load_config
    own = load_config(policy_dir / "config.json").env
    return dataclasses.replace(env, prompt_tools=own.prompt_tools, declare_tools=own.declare_tools)


def task_kinds(pool_dir: str) -> dict[str, str]:
    """task id -> its level-1 mutation kind (`ladder_stats.site_kind` without "_typo": name,
    attribute or keyword), for every task of the pool."""
    from composer_jax.env.tasks.ladder_stats import site_kind
    from composer_jax.env.tasks.pool import TaskPool
    return {t.task_id: site_kind(t).removesuffix("_typo") for t in TaskPool(pathlib.Path(pool_dir)).tasks()}


def kind_lines(kind_of: dict[str, str], rs: list, samples: int) -> list[str]:
    """Resolved per mutation kind and, with `samples` > 1 episodes per task, how many tasks were
    resolved by none, some or all of their episodes (a group of all-equal outcomes has no advantage)."""
    from composer_jax.rl.batch_metrics import resolved_of
    by_kind, by_task = {}, {}
    for r in rs:
        by_kind.setdefault(kind_of[r.task_id], []).append(resolved_of(r))
        by_task.setdefault(r.task_id, []).append(resolved_of(r))
    out = ["  per kind: " + ", ".join(f"{k} {int(sum(v))}/{len(v)} ({np.mean(v):.3f})"
                                      for k, v in sorted(by_kind.items()))]
    if samples > 1:
        none = sum(1 for v in by_task.values() if not any(v))
        every = sum(1 for v in by_task.values() if all(v))
        out.append(f"  tasks by their {samples} episodes: none resolved {none}, all {every}, "
                   f"mixed {len(by_task) - none - every} (of {len(by_task)})")
        ks = [k for k in (1, 2, 4, 8, 16, 32) if k <= samples]
        out.append("  pass@k (unbiased per task, mean over tasks): " + ", ".join(
            f"k={k} {np.mean([pass_at_k(v, k) for v in by_task.values()]):.3f}" for k in ks))
    return out


def pass_at_k(outcomes: list, k: int) -> float:
    """The chance that k of a task's n episodes, drawn without replacement, resolve it at least once
    (1 - C(n - c, k) / C(n, k), c resolved): what sharpening the policy on that task could reach."""
    n, c = len(outcomes), int(sum(outcomes))
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def evaluate_policy(policy: str, run: str, split: str, greedy: bool, n: int, show: int = 0,
                    samples: int = 1, kinds: str = "") -> list[str]:
    """Episodes of `policy` on the first `n` tasks of `split` (module docstring), `samples` per task
    (each with its own sampling seed); `show`: the decoded transcripts of the first `show` episodes too."""
    import concurrent.futures
    import dataclasses

    from composer_jax.rl.batch_metrics import (behaviour_metrics, outcome_class, outcome_metrics, resolved_of,
                                              standard_error)
    from composer_jax.rl.family_eval import FamilyEvaluator, run_config
    from composer_jax.rl.program import LocalClient, build_program
    from composer_jax.rl.task_program import task_program_spec
    from composer_jax.train.weights import load_weights
    from experiments.rl import prepare as prepare_rl

    path, _, step = policy.partition("@")
    cfg = run_config(run)       # an RL run's, or its --dry_run's: prepared here for this policy's model
    cfg = prepare_rl(dataclasses.replace(cfg, rl=dataclasses.replace(
        cfg.rl, eval_greedy=greedy, task=dataclasses.replace(cfg.rl.task, init_from=path)),
        train=dataclasses.replace(cfg.train, init_from="")))
    cfg = dataclasses.replace(cfg, env=policy_prompt(cfg.env, pathlib.Path(path)))
    program = build_program(task_program_spec(cfg))
    tasks = list(program.train_tasks() if split == "train" else program.eval_tasks())
    kind_of = task_kinds(cfg.env.pool_dir)
    if kinds:
        tasks = [t for t in tasks if kind_of[t] in kinds.split(",")]
    tasks = [t for t in tasks[:n] for _ in range(samples)]
    weights = load_weights(str(pathlib.Path(path).resolve()) + (f"@{step}" if step else ""), cfg)
    model = weights.model()
    ev = FamilyEvaluator(program, cfg, engine_model=model)
    try:
        ev._load(model, 0)
        client = LocalClient(ev._server)
        with concurrent.futures.ThreadPoolExecutor(min(cfg.rl.job.num_rollout_workers, len(tasks))) as ex:
            rs = list(ex.map(lambda it: program.run_episode(it[1], cfg.seed + it[0], client, greedy=greedy),
                             enumerate(tasks)))
    finally:
        ev.close()
    shown = []
    if show:
        from composer_jax.data.tokenizer import load_tokenizer
        tok = load_tokenizer(pathlib.Path(path) / "tokenizer.json")
        for r in rs[:show]:
            shown.append(f"--- {r.task_id}: outcome {outcome_class(r)}, resolved "
                         f"{resolved_of(r)}")
            shown += [tok.decode(seg.tokens.tolist()) for seg in r.segments]
    res = [resolved_of(r) for r in rs]
    b, o = behaviour_metrics(rs), outcome_metrics(rs)
    return [f"policy {policy} (step {weights.step}) on {len(rs)} {split} tasks, "
            f"{'greedy' if greedy else f'sampled at T={cfg.rl.temperature}'}: resolved {np.mean(res):.3f} +- "
            f"{standard_error(res):.3f}; valid-call rate {b.get('valid_call_rate', math.nan):.3f}, turns "
            f"{b.get('turns_mean', math.nan):.2f}, generated tokens {b.get('generated_tokens_mean', math.nan):.1f}, "
            f"tampered {int(o.get('tampered', 0))}",
            "  outcomes: " + ", ".join(f"{c} {int(o.get('outcome_' + c, 0))}" for c in OUTCOMES),
            *kind_lines(kind_of, rs, samples)] + shown


def demo_scores(policy: str, pool_dir: str, split: str, n: int, show: int = 0,
                attention: bool = False, edit_windows: str = "") -> list[str]:
    """Teacher-forced scores of `policy` on the scripted oracle demonstrations of the first `n`
    tasks of the pool's `split`, rendered with the policy's prompt: CE and argmax accuracy per
    assistant token, and the share of demonstrations whose every assistant token is the argmax
    (greedy decoding would reproduce them, tool results being equal); the same CE and accuracy
    split between the edit call's tokens (`edit_call_targets`) and every other assistant token.
    Then, per argument of the edit call, its value's first token (`chat.VALUE_START`): how often it
    is the argmax and its mean probability. `show` > 0: the edit-call tokens of the first `show`
    demonstrations, each wrong one followed by [the argmax, the target's probability]: where in the
    call the copies break. `attention`: per layer, where its heads look when the model writes those
    first tokens (`value_attention`). `edit_windows` "whole": score each demonstration's edit turns
    alone, after only the tool output they answer (`data.sft_env.turn_windows`, as `data.sft_turn_windows=
    edit_only` trains them) instead of the whole demonstration; "tails": that output cut to its last
    traceback frame (as `edit_tails` trains them; both `data.sft_env.window_samples`)."""
    import concurrent.futures
    import dataclasses

    import jax
    import jax.numpy as jnp

    from composer_jax.agent.episode import run_episode
    from composer_jax.data import chat
    from composer_jax.data.config import TurnWindows
    from composer_jax.data.sft_env import episode_messages, episode_sample, window_samples
    from composer_jax.data.tokenizer import load_tokenizer
    from composer_jax.env.tasks.ladder_plan import oracle_agent
    from composer_jax.env.tasks.pool import TaskPool
    from composer_jax.env.tools import declared_specs
    from composer_jax.train.weights import load_weights

    run, cfg = _policy_run(policy)
    tools = declared_specs(cfg.env.prompt_tools) if cfg.env.declare_tools else ()
    tok = load_tokenizer(run / "tokenizer.json")
    pool = TaskPool(pathlib.Path(pool_dir))
    tasks = [t for t in pool.tasks() if t.split == split][:n]
    env = dataclasses.replace(cfg.env, use_embeddings=False, pool_dir=pool_dir)
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        eps = list(ex.map(lambda t: run_episode(oracle_agent(t, pool.task_dir(t.task_id)), t,
                                                pool.task_dir(t.task_id), env), tasks))
    if edit_windows:
        mode = TurnWindows.EDIT_TAILS if edit_windows == "tails" else TurnWindows.EDIT_ONLY
        conversations = [m for m in map(episode_messages, eps) if m is not None]
        samples = [chat.encode_messages(tok, w, (), mark_values=True) for w in window_samples(conversations, mode)]
    else:
        samples = [s for s in (episode_sample(tok, e, tools) for e in eps) if s is not None]
    weights = load_weights(policy, cfg)
    model = weights.model()
    forward = jax.jit(lambda x: jax.nn.log_softmax(model(x, with_mtp=False).logits[0], -1))
    nll, hit, total, exact, shown = 0.0, 0, 0, 0, []
    part_nll, part_hit, part_total = np.zeros(2), np.zeros(2), np.zeros(2)   # [edit call, rest]
    firsts: dict[str, list] = {}      # argument -> [(argmax right, p of the target)]
    looks: list[tuple[list, int, list]] = []
    for ids, mask in samples:
        lp = np.asarray(forward(jnp.asarray([ids], jnp.int32)))[:-1]
        tgt, m = np.asarray(ids[1:]), np.asarray(mask[1:], bool)
        value_first = np.asarray(mask[1:]) == VALUE_START
        token_nll = -lp[np.arange(len(tgt)), tgt]
        nll += float(token_nll[m].sum())
        right = lp.argmax(-1) == tgt
        ok = right[m]
        hit, total, exact = hit + int(ok.sum()), total + int(m.sum()), exact + int(ok.all())
        edit = edit_call_targets(tok, ids, m)
        for i, part in enumerate((m & edit, m & ~edit)):
            part_nll[i] += token_nll[part].sum()
            part_hit[i] += right[part].sum()
            part_total[i] += part.sum()
        starts = np.flatnonzero(edit & value_first)
        for k in starts:
            name = re.search(r'"(\w+)": "?$', tok.decode(list(ids[max(0, k - 7):k + 1])))
            firsts.setdefault(name.group(1) if name else "?", []).append((bool(right[k]), float(np.exp(-token_nll[k]))))
        if attention and len(starts):
            looks += [(ids, k, maps) for k, maps in zip(starts, value_attention(model, ids, starts))]
        if len(shown) < show:
            shown.append("  edit call: " + " ".join(
                repr(tok.decode([int(tgt[k])])) + ("" if right[k] else
                f"[{tok.decode([int(lp[k].argmax())])!r} p={np.exp(-token_nll[k]):.2f}]")
                for k in np.flatnonzero(m & edit)))
    parts = "; ".join(f"{name} {int(n)} tokens, accuracy {h / max(n, 1):.3f}, CE {c / max(n, 1):.3f}"
                      for name, n, h, c in zip(("edit call", "the rest"), part_total, part_hit, part_nll))
    return [f"policy {policy} (step {weights.step}) on the oracle demonstrations of {len(samples)} "
            f"{split} tasks{f' (their edit turns alone, {edit_windows} outputs)' if edit_windows else ''} (teacher-forced): CE {nll / total:.3f} per assistant token, argmax "
            f"accuracy {hit / total:.3f} ({total} tokens), demonstrations reproduced exactly "
            f"{exact}/{len(samples)}", f"  per part: {parts}",
            "  edit call, each value's first token: " + "; ".join(
                f"{name} argmax {sum(r for r, _ in v)}/{len(v)}, mean p {np.mean([p for _, p in v]):.3f}"
                for name, v in firsts.items()),
            *(attention_summary(tok, looks) if attention else []), *shown]


def value_attention(model, ids, positions) -> list[list[np.ndarray]]:
    """For each target index k of `positions` (the model at token k writes ids[k + 1]): the
    attention of every layer over the tokens <= k, `[heads, k + 1]` per layer. The attention
    probabilities are captured from `composer_jax.model.attention._latent_attention`, wrapped for
    this one forward pass (the same softmax; the model's output is not used)."""
    import jax
    import jax.numpy as jnp

    from composer_jax.model import attention as attn

    captured: list[np.ndarray] = []
    original = attn._latent_attention

    def capturing(q, c, k_pe, wkv_b, q_seg, kv_seg, q_idx, kv_idx, scale, kv_block, n_nope, dtype):
        k, v = attn.mla_kv(n_nope, dtype, wkv_b, c, k_pe)
        logits = jnp.einsum("bthd,bshd->bhts", q, k, preferred_element_type=jnp.float32) * scale
        mask = attn.attention_mask(q_seg, kv_seg, q_idx, kv_idx)
        probs = jax.nn.softmax(jnp.where(mask[:, None], logits, -1e30), -1)
        jax.debug.callback(lambda p: captured.append(np.asarray(p)), probs[0])
        return jnp.einsum("bhts,bshd->bthd", probs.astype(v.dtype), v)

    attn._latent_attention = capturing
    try:
        model(jnp.asarray([ids], jnp.int32), with_mtp=False)
    finally:
        attn._latent_attention = original
    return [[layer[:, k, :k + 1] for layer in captured] for k in positions]


def attention_summary(tok, looks) -> list[str]:
    """Per layer, over every head at every edit-call value start: the share whose most attended
    token is an earlier copy of the value's first token (the copy a head could write), or the token
    just before one (the source's context, one step early), the mean weight of the most attended
    token (near 1: saturated heads), and the tokens most attended."""
    from collections import Counter

    out = []
    layers = len(looks[0][2]) if looks else 0
    for layer in range(layers):
        on_copy = before_copy = heads = 0
        top_weight = 0.0
        tops = Counter()
        for ids, k, maps in looks:
            target = ids[k + 1]
            for row in maps[layer]:
                top = int(np.argmax(row))
                heads += 1
                top_weight += float(row[top])
                on_copy += ids[top] == target
                before_copy += top + 1 <= k and ids[top + 1] == target
                tops[tok.decode([int(ids[top])])] += 1
        out.append(f"  attention at those tokens, layer {layer}: top on an earlier copy of the target "
                   f"{on_copy}/{heads}, on the token before one {before_copy}/{heads}; mean top weight "
                   f"{top_weight / max(heads, 1):.2f}; most attended "
                   + ", ".join(f"{t!r} {c}" for t, c in tops.most_common(4)))
    return out


def edit_call_targets(tok, ids, targets_mask: np.ndarray) -> np.ndarray:
    """[len(ids) - 1] bool over next-token targets: True for the targets of an assistant turn
    (a run of `targets_mask`) that come after the turn's `search_replace` tool name, i.e. the edit
    call's arguments, whose file path and names are copied from the context."""
    out = np.zeros(len(targets_mask), bool)
    j = 0
    while j < len(targets_mask):
        if not targets_mask[j]:
            j += 1
            continue
        start = j
        while j < len(targets_mask) and targets_mask[j]:
            j += 1
        for k in range(start, j):   # target k is ids[k + 1]; the turn before it is ids[start + 1 : k + 1]
            if "search_replace" in tok.decode(list(ids[start + 1:k + 1])):
                out[k:j] = True
                break
    return out


def copy_probe(policy: str, n: int = 16, length: int = 100, seed: int = 0, ids: int = 0) -> list[str]:
    """Induction check of a run's weights: mean CE per token on the first and on the second copy
    of `n` random token sequences of `length` ids, each repeated once (ids from the upper
    vocabulary, no special tokens). A model that copies from its context has a far lower CE on
    the second copy; ln(vocab) is chance."""
    import jax
    import jax.numpy as jnp

    from composer_jax.train.losses import target_logprobs
    from composer_jax.train.weights import load_weights

    _, cfg = _policy_run(policy)
    weights = load_weights(policy, cfg)
    model = weights.model()
    vocab = cfg.model.vocab_size
    low, high = (len(ALL_SPECIAL_TOKENS), len(ALL_SPECIAL_TOKENS) + ids) if ids else (vocab // 4, vocab)
    seqs = np.random.default_rng(seed).integers(low, high, size=(n, length))
    x = jnp.asarray(np.concatenate([seqs, seqs], 1), jnp.int32)
    nll = -np.asarray(jax.jit(lambda x: target_logprobs(model(x, with_mtp=False).logits[:, :-1], x[:, 1:]))(x))
    first, second = nll[:, :length - 1].mean(), nll[:, length:].mean()
    return [f"policy {policy} (step {weights.step}): CE per token on {n} random {length}-token sequences "
            f"of ids [{low}, {high}) "
            f"repeated once: first copy {first:.2f}, second copy {second:.2f} (chance ln {vocab} = "
            f"{math.log(vocab):.2f})"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="*")
    ap.add_argument("--policy", default="")
    ap.add_argument("--config", default="")
    ap.add_argument("--split", default="eval", choices=("eval", "train"))
    ap.add_argument("--greedy", action="store_true")
    ap.add_argument("--tasks", type=int, default=64)
    ap.add_argument("--samples", type=int, default=1,
                    help="with --policy and --config: episodes per task (each its own sampling seed)")
    ap.add_argument("--kinds", default="",
                    help="with --policy and --config: only tasks of these mutation kinds (name,attribute,keyword)")
    ap.add_argument("--show", type=int, default=0,
                    help="with --policy: print the first N transcripts (with --demos: their edit calls, "
                    "token by token)")
    ap.add_argument("--demos", action="store_true",
                    help="with --policy and --pool: teacher-forced scores on oracle demonstrations")
    ap.add_argument("--attention", action="store_true",
                    help="with --demos: where each layer's heads look when the edit call's values start")
    ap.add_argument("--edit_windows", default="", choices=("", "whole", "tails"),
                    help="with --demos: score the edit turns alone, after only the tool output they answer "
                    "(whole, or cut to its last traceback frame: tails)")
    ap.add_argument("--copy_probe", action="store_true",
                    help="with --policy: CE on repeated random token sequences (copying from context)")
    ap.add_argument("--copy_length", type=int, default=100,
                    help="with --copy_probe: tokens per random sequence (the copy distance)")
    ap.add_argument("--copy_ids", type=int, default=0,
                    help="with --copy_probe: draw from the first N non-special ids (0: the upper 3/4)")
    ap.add_argument("--pass_rates", choices=("", "mixed", "resolved"), default="",
                    help="with RUN...: write --out, an rl.task.train_tasks_file of the training tasks "
                    "whose pass rate over the runs' rollouts is in (0, 1) (mixed) or > 0 (resolved)")
    ap.add_argument("--max_version", type=int, default=10**9,
                    help="with --pass_rates: only rollouts sampled by policy versions <= this")
    ap.add_argument("--pool", default="")
    ap.add_argument("--sft", default="")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    if a.policy and a.copy_probe:
        print("\n".join(copy_probe(a.policy, length=a.copy_length, ids=a.copy_ids)))
        return 0
    if a.policy and a.demos:
        print("\n".join(demo_scores(a.policy, a.pool, a.split, a.tasks, a.show, a.attention, a.edit_windows)))
        return 0
    if a.policy:
        print("\n".join(evaluate_policy(a.policy, a.config, a.split, a.greedy, a.tasks, a.show, a.samples, a.kinds)))
        return 0
    if a.pass_rates:
        if not a.out:
            ap.error("--pass_rates needs --out FILE")
        text, summary = pass_rate_file([pathlib.Path(r) for r in a.runs], a.max_version, a.pass_rates)
        pathlib.Path(a.out).write_text(text)
        print("\n".join(summary + [f"wrote {a.out}"]))
        return 0
    lines, infos = [], []
    for run in a.runs:
        text, info = run_report(pathlib.Path(run))
        lines += text
        infos.append(info)
    line, pooled_info = pooled(infos)
    lines.append(line)
    leaks = 0
    if a.pool and a.sft:
        text, leaks = disjoint(a.pool, a.sft, [pathlib.Path(r) for r in a.runs])
        lines += text
    print("\n".join(lines))
    if a.out:
        pathlib.Path(a.out).write_text(json.dumps({"runs": infos, "pooled": pooled_info, "leaks": leaks}, indent=1))
    return 1 if leaks else 0


if __name__ == "__main__":
    sys.exit(main())
