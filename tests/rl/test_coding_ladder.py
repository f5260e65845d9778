"""The coding family on the difficulty ladder: rl.task.levels, its train / held-out tasks, and
held-out modules absent from every training row, checked on rendered token ids (no sandbox)."""
from __future__ import annotations

import dataclasses
import itertools
import json
import pathlib
import random

import pytest

from composer_jax.config import Config, RLConfig
from composer_jax.config.rl import CodingTaskConfig
from composer_jax.data.chat import encode_messages, encode_prompt
from composer_jax.data.config import SplitPattern
from composer_jax.data.sft_env import hasty_messages, replacement_names
from composer_jax.data.sft_rename import renamed_messages
from composer_jax.data.tokenizer import train_tokenizer
from composer_jax.env import protocol as p
from composer_jax.env.config import EnvConfig
from composer_jax.env.pythons import find_pythons
from composer_jax.env.tasks import ladder_sites, mutate, statements
from composer_jax.env.tasks.ladder_disjoint import find_leaks, heldout_signatures
from composer_jax.config.rl import LadderKeywords
from composer_jax.env.tasks.ladder_generate import (KEYWORDS_FILE, LadderSpec, check_pool_keywords,
                                                    generate_ladder, level_kind, pool_keywords)
from composer_jax.env.tasks.ladder_plan import (last_frame, ladder_plan, oracle_agent, renamed_name,
                                                 traceback_edit)
from composer_jax.env.tasks.ladder_split import split_of
from composer_jax.env.tasks.pool import TaskPool
from composer_jax.env.tasks.task import Task, unified_patch
from composer_jax.env.tools import TOOL_SPECS
from composer_jax.errors import ConfigError
from composer_jax.agent.rollout import Rollout
from composer_jax.agent.token_agent import TokenAgent
from composer_jax.env.tasks.ladder_stats import site_kind
from composer_jax.rl.batch_metrics import level_metrics
from composer_jax.rl.tasks.coding import CodingFamily, interleave

# small stdlib modules on both sides of the split (heldout.py's three, and seed 0's hash)
MODULES = ("getopt", "glob", "fnmatch", "textwrap", "colorsys", "shlex")
HELD = {m for m in MODULES if split_of(m, 0, 0.2) == "eval"}


def _stdlib(version: str, name: str) -> tuple[str, str]:
    lib = pathlib.Path(find_pythons()[version].stdlib)
    return ((lib / f"{name}.py").read_text(encoding="utf-8"),
            (lib / "test" / f"test_{name}.py").read_text(encoding="utf-8"))


def _pool(tmp: pathlib.Path) -> TaskPool:
    """Ladder tasks built like env_ladder's, minus the sandbox checks: 2 level-1 and 1 level-2
    per module, split by the ladder's module split."""
    version = max((v for v in find_pythons() if ladder_sites.supports_hints(v)),
                  key=lambda v: tuple(map(int, v.split("."))))
    pool = TaskPool(tmp / "pool")
    for name in MODULES:
        text, tests = _stdlib(version, name)
        rng = random.Random(name)
        picks = list(itertools.islice(ladder_sites.sites(text, 1, version, rng), 2)) + \
            list(itertools.islice(ladder_sites.sites(text, 2, version, rng), 1))
        for i, site in enumerate(picks):
            broken = mutate.apply(text, [site.mutation])
            rel, test_rel = f"{name}.py", f"test_{name}.py"
            patch, n = unified_patch({rel: broken}, {rel: text})
            f2p = (f"test_{name}.T.test_{i}",)
            pool.add(Task(f"{level_kind(site.level)}-{version}-{name}-{i}", level_kind(site.level),
                          split_of(name, 0, 0.2), version, name,
                          statements.bug_statement(rel, test_rel, f2p, {}), f2p, (), (rel,),
                          (test_rel,), patch, n, version, version, (site.mutation.describe(),)),
                     {rel: broken, test_rel: tests}, {rel: text})
    return pool


def _tokenizer(pool: TaskPool):
    texts = [p.SYSTEM_PROMPT, json.dumps(list(TOOL_SPECS))]
    for t in pool.tasks():
        texts.append((pool.task_dir(t.task_id) / "solution" / t.edit_files[0]).read_text())
    return train_tokenizer(texts, 1024, SplitPattern.KIMI)


def _traceback(task: Task, d: pathlib.Path) -> str:
    """The tail of a failing run as CPython prints it: the broken line's frame for a level-1
    one-line fix (so the oracle takes the short episode), else a frame of the module's line 3."""
    rel, line, old = (traceback_edit(task, d) or (task.edit_files[0], 3, "f()"))[:3]
    return f'  File "/workspace/{rel}", line {line}, in f\n    {old}\nNameError: name'


def _episode_row(tok, pool: TaskPool, task: Task, hasty: bool = False, rename: int = -1) -> list[int]:
    """An SFT row of the oracle's ladder episode of `task` (`oracle_agent`, as the SFT builder
    plays it): statement, every call, and as tool results a traceback (`_traceback`), the module's
    whole text for a read, "ok" for the rest. `hasty`: data.sft_hasty's variant; `rename` >= 0:
    data.sft_renames' variant with that seed."""
    d = pool.task_dir(task.task_id)
    module = (d / "snapshot" / task.edit_files[0]).read_text()
    messages = [{"role": "system", "content": p.SYSTEM_PROMPT},
                {"role": "user", "content": task.problem_statement}]
    agent = oracle_agent(task, d)
    for k in itertools.count():
        turn = p.parse_assistant(agent(messages), first_index=k)
        messages.append({"role": "assistant", "content": turn.content,
                         "tool_calls": [c.to_json() for c in turn.tool_calls]})
        name = turn.tool_calls[0].name
        if name == "finish":
            break
        result = (_traceback(task, d) if k == 0 else module if name == "read_file" else "ok")
        messages.append({"role": "tool", "tool_call_id": f"functions.x:{k}", "content": result})
    if hasty:
        messages = hasty_messages(messages)
    if rename >= 0:
        messages = renamed_messages(messages, replacement_names(pool.root), random.Random(rename))
    return encode_messages(tok, messages, TOOL_SPECS)[0]


def _family(pool: TaskPool, tmp: pathlib.Path, tok, levels=(1,), **task_kw) -> CodingFamily:
    tok.save(tmp / "tokenizer.json")
    task = CodingTaskConfig(levels=levels, num_train_tasks=64, num_eval_tasks=64,
                            tokenizer=str(tmp / "tokenizer.json"), **task_kw)
    base = Config()
    cfg = dataclasses.replace(base, rl=RLConfig(task=task),
                              model=dataclasses.replace(base.model, vocab_size=tok.vocab_size),
                              env=EnvConfig(pool_dir=str(pool.root), use_embeddings=False))
    return CodingFamily(cfg)


def test_levels_select_train_and_heldout_tasks_of_disjoint_modules(tmp_path):
    pool = _pool(tmp_path)
    fam = _family(pool, tmp_path, _tokenizer(pool), levels=(1, 2))
    train, held = fam.make_tasks("train"), fam.make_tasks("eval")
    by_id = {t.task_id: t for t in pool.tasks()}
    assert train and held
    assert {by_id[i].split for i in train} == {"train"} and {by_id[i].split for i in held} == {"eval"}
    assert not {by_id[i].module for i in train} & {by_id[i].module for i in held}
    assert {by_id[i].module for i in held} == HELD >= {"textwrap", "colorsys", "shlex"}
    assert {by_id[i].module for i in train} == set(MODULES) - HELD
    assert by_id[train[0]].kind != by_id[train[1]].kind          # interleaved by level
    one = _family(pool, tmp_path, _tokenizer(pool), levels=(2,))
    assert {by_id[i].kind for i in one.make_tasks("train") + one.make_tasks("eval")} == {"level2"}
    assert one.make_eval_fn() is None       # held-out = the family's own episodes
    assert interleave([[1, 2, 3], [4]]) == [1, 4, 2, 3]
    with pytest.raises(ConfigError):
        CodingTaskConfig(levels=(3,))


def test_a_task_list_file_selects_the_training_tasks_and_refuses_held_out_ones(tmp_path):
    pool = _pool(tmp_path)
    tok = _tokenizer(pool)
    full = _family(pool, tmp_path, tok)
    train, held = full.make_tasks("train"), full.make_tasks("eval")
    listed = tmp_path / "tasks.txt"
    listed.write_text(f"# mixed-rate tasks\n{train[2]}  # 1/4\n\n{train[0]}\n")
    fam = _family(pool, tmp_path, tok, train_tasks_file=str(listed))
    assert fam.make_tasks("train") == [train[2], train[0]]       # the file's order
    assert fam.make_tasks("eval") == held                         # held-out split unchanged
    for text, why in [(f"{train[0]}\n{held[0]}\n", "held-out"), ("level1-nope\n", "not in the pool"),
                      (f"{train[0]}\n{train[0]}\n", "repeats"), ("# nothing\n", "lists no task")]:
        listed.write_text(text)
        with pytest.raises(ConfigError, match=why):
            _family(pool, tmp_path, tok, train_tasks_file=str(listed))
    with pytest.raises(ConfigError, match="no such file"):
        _family(pool, tmp_path, tok, train_tasks_file=str(tmp_path / "missing.txt"))


def test_ladder_episodes_are_labelled_by_level_and_site_kind_for_per_kind_rows(tmp_path, monkeypatch):
    pool = _pool(tmp_path)
    fam = _family(pool, tmp_path, _tokenizer(pool), levels=(1, 2))
    by_id = {t.task_id: t for t in pool.tasks()}
    resolved = {}

    def fake_run(self, task, task_dir, checkpoint=None, resume=None):    # the episode itself: no sandbox
        resolved[task.task_id] = float(len(resolved) % 2)
        return Rollout(task.task_id, "g0", [], {"total": 0.0, "resolved": resolved[task.task_id]})

    monkeypatch.setattr(TokenAgent, "run", fake_run)
    ids = fam.make_tasks("train") + fam.make_tasks("eval")
    rs = [fam.run_episode(i, 0, None, greedy=True) for i in ids]
    want = {f"{by_id[i].kind}_{site_kind(by_id[i])}" for i in ids}
    assert {r.info["level"] for r in rs} == want
    assert {k.split("_")[0] for k in want} == {"level1", "level2"} and len(want) >= 3
    assert any(k.endswith("_typo") for k in want)                     # level 1: name/attribute/keyword
    rows = level_metrics(rs, "eval_")
    for label in want:
        mine = [resolved[r.task_id] for r in rs if r.info["level"] == label]
        assert rows[f"eval_{label}_count"] == len(mine)
        assert rows[f"eval_{label}_resolved_rate"] == pytest.approx(sum(mine) / len(mine))


def test_a_ladder_pool_keeps_the_keyword_sites_it_was_made_with(tmp_path):
    pool = _pool(tmp_path)                       # ladder tasks made before the option: no record, ANY
    assert not (pool.root / KEYWORDS_FILE).exists() and pool_keywords(pool.root) is LadderKeywords.ANY
    full = LadderSpec(levels=(1,), train=1, heldout=1)                  # already full: nothing to make
    env = EnvConfig(use_embeddings=False)
    assert generate_ladder(env, pool.root, full, progress=False)["level1/train"]["made"] == 0
    with pytest.raises(ConfigError, match="ladder_keywords=any, this run asks for hinted"):
        generate_ladder(env, pool.root, dataclasses.replace(full, keywords=LadderKeywords.HINTED),
                        progress=False)
    fresh = tmp_path / "fresh"                   # an empty pool records what its first run asks for
    check_pool_keywords(fresh, LadderKeywords.HINTED)
    assert (fresh / KEYWORDS_FILE).read_text() == "hinted" and pool_keywords(fresh) is LadderKeywords.HINTED
    check_pool_keywords(fresh, LadderKeywords.ANY)      # still no task in it: the record follows the run
    assert pool_keywords(fresh) is LadderKeywords.ANY


def test_heldout_modules_never_in_training_rows_on_token_ids(tmp_path):
    pool = _pool(tmp_path)
    tok = _tokenizer(pool)
    fam = _family(pool, tmp_path, tok, levels=(1, 2))
    sigs = heldout_signatures(pool, tok.encode)
    assert set(sigs) == HELD and all(len(s) >= 3 for s in sigs.values())
    by_id = {t.task_id: t for t in pool.tasks()}
    train = [by_id[i] for i in fam.make_tasks("train")]
    rows = [_episode_row(tok, pool, t, hasty) for t in train for hasty in (False, True)]  # SFT rows
    renamed = [_episode_row(tok, pool, t, rename=k) for t in train for k in range(3)]   # data.sft_renames
    assert all(r not in rows for r in renamed) and len(set(map(tuple, renamed))) == len(renamed)
    rows += renamed
    rows += [encode_prompt(tok, [{"role": "system", "content": p.SYSTEM_PROMPT},
                                 {"role": "user", "content": t.problem_statement}], TOOL_SPECS)
             for t in train]                                                  # RL prompts
    assert find_leaks(rows, sigs) == []
    # the check can fail: the held-out tasks' own rows carry their module's signatures
    held_rows = [_episode_row(tok, pool, by_id[i]) for i in fam.make_tasks("eval")]
    found = {m for _, m, _ in find_leaks(held_rows, sigs)}
    assert found == set(sigs)


def test_ladder_plan_reruns_step_ones_test_in_a_short_turn(tmp_path):
    pool = _pool(tmp_path)
    tok = _tokenizer(pool)
    one_line_reads = 0
    for task in pool.tasks():
        plan = ladder_plan(task, pool.task_dir(task.task_id))
        names = [n for n, _ in plan]
        assert names[:2] == ["run_terminal_cmd", "read_file"] and names[-2:] == ["run_terminal_cmd",
                                                                                  "finish"]
        read, edit = plan[1][1], plan[2][1]
        if plan[2][0] == "search_replace" and edit["old_string"].rstrip("\n").count("\n") == 0:
            # a one-line fix reads exactly that line: copying its number, no arithmetic
            assert read["start_line"] == read["end_line"]
            before = (pool.task_dir(task.task_id) / "snapshot" / read["target_file"]).read_text()
            assert before.splitlines()[read["start_line"] - 1] == edit["old_string"].rstrip("\n")
            one_line_reads += 1
        first, rerun = plan[0][1]["command"], plan[-2][1]["command"]
        assert first.split(" 2>&1")[0] == rerun.split(" 2>&1")[0] == \
            f"python -m unittest {task.fail_to_pass[0]}"
        text = p.render_assistant("", [plan[-2]], first_index=len(plan) - 2)
        assert len(tok.encode(text)) < 120
    assert one_line_reads > 0


def _calls(agent, outputs: list[str]) -> list[tuple[str, dict]]:
    """The calls `agent` makes when its tool results are `outputs` in turn (then "ok")."""
    messages, calls = [{"role": "system", "content": p.SYSTEM_PROMPT}, {"role": "user", "content": "fix"}], []
    for k in range(8):
        call = p.parse_assistant(agent(messages), first_index=k).tool_calls[0]
        calls.append((call.name, call.arguments))
        if call.name == "finish":
            break
        messages += [{"role": "assistant", "content": ""},
                     {"role": "tool", "content": outputs[k] if k < len(outputs) else "ok"}]
    return calls


def test_level1_oracle_edits_the_line_its_traceback_shows_else_runs_the_failing_test(tmp_path):
    pool = _pool(tmp_path)
    short = names = 0
    for task in pool.tasks():
        d = pool.task_dir(task.task_id)
        edit = traceback_edit(task, d)
        if task.kind != "level1":
            assert edit is None and _calls(oracle_agent(task, d), []) == ladder_plan(task, d)
            continue
        if edit is None:
            continue
        rel, line, src, fixed, old, new = edit
        before = (d / "snapshot" / rel).read_text()
        after = (d / "solution" / rel).read_text()
        assert before.count(src) == 1 and before.replace(src, fixed) == after   # the stripped line's edit
        assert before.count(old) == 1 and before.replace(old, new) == after     # the call's edit
        names += (old, new) != (src, fixed)
        shown = f'Traceback:\n  File "/workspace/{rel}", line {line}, in f\n    {src}\n    ^^^\nNameError: x'
        assert last_frame("  File \"/workspace/t.py\", line 9, in g\n    g()\n" + shown) == (rel, line, src)
        calls = _calls(oracle_agent(task, d), [shown])
        assert calls == [("run_terminal_cmd", {"command": "python -m unittest 2>&1 | grep -B3 -m1 'Error: '"}),
                         ("search_replace", {"file_path": rel, "old_string": old, "new_string": new}),
                         ("run_terminal_cmd", {"command": "python -m unittest 2>&1 | tail -n 3"}),
                         ("finish", {"message": "Fixed; the failing tests pass now."})]
        short += 1
        # the suite's tail ends in another failure (or a frame of another line): the careful plan,
        # which runs the first failing test by id and reads the line, after the suite run
        for other in ("FAIL: test_x\nAssertionError: 1 != 2",
                      shown.replace(f"line {line},", f"line {line + 1},")):
            calls = _calls(oracle_agent(task, d), [other])
            assert calls[0][1]["command"] == "python -m unittest 2>&1 | grep -B3 -m1 'Error: '"
            assert calls[1:] == ladder_plan(task, d)
    assert short >= 3 and names >= 1
    assert renamed_name("f(a, dir_fdd=d)", "f(a, dir_fd=d)", "x = f(a, dir_fdd=d)\n") == ("dir_fdd", "dir_fd")
    assert renamed_name("f(nde.x)", "f(node.x)", "f(nde.x)\nindex\n") is None     # "nde" in "index"
    assert renamed_name("f(a, b)", "f(b, a)", "f(a, b)") is None                       # two names changed


def test_prompt_tools_shorten_the_prompt_and_follow_the_policys_sft(tmp_path):
    from composer_jax.env.tools import TOOL_NAMES, declared_specs
    from composer_jax.rl.tasks.coding import with_policy_prompt_tools
    four = ("read_file", "search_replace", "run_terminal_cmd", "finish")
    assert declared_specs() == tuple(TOOL_SPECS)
    assert [s["name"] for s in declared_specs(four[::-1])] == list(four[:1]) + ["search_replace",
                                                                                "run_terminal_cmd", "finish"]
    assert set(TOOL_NAMES) > set(four)
    with pytest.raises(ValueError):
        declared_specs(("read_file", "teleport"))
    pool = _pool(tmp_path)
    tok = _tokenizer(pool)
    system = [{"role": "system", "content": p.SYSTEM_PROMPT}]
    full, short = (len(encode_prompt(tok, system, tools)) for tools in (TOOL_SPECS, declared_specs(four)))
    assert short < 0.65 * full
    run = tmp_path / "sft"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"data": {"sft_prompt_tools": list(four)}}))
    cfg = Config()
    assert with_policy_prompt_tools(cfg, run).env.prompt_tools == four
    assert with_policy_prompt_tools(cfg, tmp_path).env == cfg.env        # no run config: unchanged
    other = dataclasses.replace(cfg, env=EnvConfig(prompt_tools=("finish",)))
    with pytest.raises(ConfigError):
        with_policy_prompt_tools(other, run)


def test_declare_tools_false_leaves_the_prompt_without_tools_and_follows_the_policys_sft(tmp_path):
    from composer_jax.agent.forced_engine import ForcedEngine
    from composer_jax.agent.token_agent import TokenAgent
    from composer_jax.rl.tasks.coding import with_policy_prompt_tools
    from experiments.rl import _coding_ladder_config
    four = ("read_file", "search_replace", "run_terminal_cmd", "finish")
    with pytest.raises(ConfigError):
        EnvConfig(declare_tools="no")
    tok = _tokenizer(_pool(tmp_path))
    agents = {d: TokenAgent(ForcedEngine(1536, 1024), tok, env_cfg=EnvConfig(prompt_tools=four, declare_tools=d))
              for d in (True, False)}
    assert [s["name"] for s in agents[True].tools] == list(four) and agents[False].tools == ()
    system = [{"role": "system", "content": p.SYSTEM_PROMPT}]
    with_four, bare = (len(encode_prompt(tok, system, agents[d].tools)) for d in (True, False))
    assert bare < 0.5 * with_four
    run = tmp_path / "sft"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"data": {"sft_prompt_tools": list(four),
                                                          "sft_declare_tools": False}}))
    ladder = _coding_ladder_config(2)
    assert ladder.env.declare_tools is False and ladder.rl.seq_len == 1536
    for cfg in (Config(), ladder):             # either default follows the policy's samples
        env = with_policy_prompt_tools(cfg, run).env
        assert (env.prompt_tools, env.declare_tools) == (four, False)
    (run / "config.json").write_text(json.dumps({"data": {"sft_declare_tools": True}}))
    assert with_policy_prompt_tools(ladder, run).env.declare_tools is True
    (run / "config.json").write_text(json.dumps({"data": {}}))   # an older run: cfg's own prompt
    assert with_policy_prompt_tools(ladder, run).env == ladder.env


def test_sft_takes_the_samples_prompt_from_env_and_refuses_a_data_key_it_would_replace():
    from composer_jax.data.config import DataConfig
    from experiments.pretrain import _with_env_prompt
    four = ("read_file", "search_replace", "run_terminal_cmd", "finish")
    cfg = dataclasses.replace(Config(), env=EnvConfig(prompt_tools=four, declare_tools=False))
    data = _with_env_prompt(cfg)
    assert (data.sft_prompt_tools, data.sft_declare_tools) == (four, False)
    same = dataclasses.replace(cfg, data=data)                 # a rerun from its config.json
    assert _with_env_prompt(same) == data
    other = dataclasses.replace(Config(), data=DataConfig(sft_declare_tools=False))
    with pytest.raises(ConfigError, match="set that instead"):
        _with_env_prompt(other)                                # env.declare_tools is True


def test_ladder_runs_get_the_ladder_defaults_and_keep_what_the_user_set():
    from composer_jax import registry
    from composer_jax.config import SECTION_PRESETS
    from composer_jax.overrides import apply_overrides
    from experiments.rl import _coding_config, _coding_ladder_config
    exp = registry.get("rl_async")
    c = apply_overrides(exp.make_config(), ["rl.task=coding", "rl.task.levels=1",
                                            "rl.task.init_from=runs/sft", "rl.steps=12"],
                        SECTION_PRESETS, rebase=exp.rebase)
    assert c.rl.eval_greedy is False and c.env.max_turns == 6 and c.rl.max_new_tokens == 160
    assert (c.rl.task.levels, c.rl.task.init_from, c.rl.task.num_eval_tasks) == ((1,), "runs/sft", 64)
    assert c.rl.steps == 12 and c.rl.job.eval_every == 20 and c.rl.weight_sync.dtype == ""
    assert c.train.lr == 3e-4 and c.env.max_turns > len(["run", "read", "edit", "rerun", "finish"])
    assert _coding_config(2).rl.eval_greedy and _coding_config(2).env.max_turns == 4   # older family
    # every key the user set wins, also one equal to the lookup experiment's default (the defect
    # of the merge this replaced: rl.max_new_tokens=40 and train.lr=3e-4 were taken as unset)
    lookup = exp.make_config()
    assert lookup.rl.max_new_tokens == 40 != _coding_ladder_config(2).rl.max_new_tokens
    mine = apply_overrides(lookup, ["rl.task=coding", "rl.task.levels=1", "rl.max_new_tokens=40",
                                    "rl.seq_len=2048", "rl.max_staleness=1"],
                           SECTION_PRESETS, rebase=exp.rebase)
    assert (mine.rl.max_new_tokens, mine.rl.seq_len, mine.rl.max_staleness) == (40, 2048, 1)
    assert mine.env.max_turns == 6 and mine.rl.task.ladder_train == 240     # the rest: the ladder's
