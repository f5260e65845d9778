import json

import pytest

from composer_jax.env import protocol as p
from composer_jax.env.agents import OracleAgent, edit_plan, null_agent
from composer_jax.agent.episode import run_episode
from composer_jax.env.tasks.pool import TaskPool
from composer_jax.env.tasks.task import Task, unified_patch

from env_helpers import needs_bwrap

pytestmark = needs_bwrap

GOOD = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
BAD = GOOD.replace("return a + b", "return a - b")
TESTS = ("import unittest\nimport mod\n\n\nclass T(unittest.TestCase):\n"
         "    def test_add(self):\n        self.assertEqual(mod.add(2, 3), 5)\n\n"
         "    def test_sub(self):\n        self.assertEqual(mod.sub(5, 3), 2)\n")


@pytest.fixture
def task_env(tmp_path, cfg):
    pool = TaskPool(tmp_path / "pool")
    patch, n = unified_patch({"mod.py": BAD}, {"mod.py": GOOD})
    task = Task("t1", "bug", "train", cfg.python_versions[0], "mod", "test_add fails; fix mod.py",
                ("test_mod.T.test_add",), ("test_mod.T.test_sub",), ("mod.py",), ("test_mod.py",),
                patch, n, cfg.python_versions[0], cfg.python_versions[0])
    pool.add(task, {"mod.py": BAD, "test_mod.py": TESTS}, {"mod.py": GOOD})
    return task, pool.task_dir("t1")


def scripted(*turns):
    """An agent replaying fixed texts (the last one repeats)."""
    state = {"i": 0}

    def agent(messages):
        text = turns[min(state["i"], len(turns) - 1)]
        state["i"] += 1
        return text
    return agent


def test_edit_plan_reconstructs_target():
    target = GOOD + "\n\ndef mul(a, b):\n    return a * b\n"
    text = BAD
    for name, args in edit_plan(BAD, target):
        assert name == "search_replace" and text.count(args["old_string"]) == 1
        text = text.replace(args["old_string"], args["new_string"], 1)
    assert text == target


def test_oracle_resolves_and_null_does_not(task_env, cfg, tmp_path):
    task, d = task_env
    ep = run_episode(OracleAgent(task, d), task, d, cfg)
    assert ep.stop_reason == "finish" and ep.grade.resolved
    assert (ep.grade.f2p_passed, ep.grade.p2p_passed) == (1, 1)
    assert ep.changed_files == ["mod.py"] and ep.num_invalid_calls == 0
    r = ep.reward
    assert r.total == pytest.approx(1.0 + r.valid_calls + r.communication - r.length)
    assert r.tampering == 0.0 and not ep.tampered and ep.token_count_source == "chars/4"
    ep.save_jsonl(tmp_path / "t.jsonl")
    lines = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert [x["type"] for x in lines][:2] == ["message", "message"]
    assert lines[-1]["type"] == "summary" and lines[-1]["grade"]["resolved"] is True
    assert sum(x["type"] == "call" for x in lines) == ep.num_calls == 3
    null = run_episode(null_agent, task, d, cfg)
    assert not null.grade.resolved and null.reward.total < 0 and null.num_turns == 1
    assert null.grade.f2p_passed == 0 and null.grade.p2p_passed == 1


def test_malformed_calls_get_errors_and_the_episode_goes_on(task_env, cfg):
    task, d = task_env
    garbled = p.TOOL_CALLS_BEGIN + p.TOOL_CALL_BEGIN + "functions.read_file:0" + \
        p.TOOL_CALL_ARG_BEGIN + "{oops" + p.TOOL_CALL_END + p.TOOL_CALLS_END
    agent = scripted(garbled, p.render_assistant("", [("nope", {})]),
                     p.render_assistant("", [("read_file", {"target_file": "mod.py", "x": 1})]),
                     "I give up, it is fixed.")
    ep = run_episode(agent, task, d, cfg)
    assert ep.stop_reason == "no_tool_call" and ep.num_turns == 4
    assert (ep.num_calls, ep.num_invalid_calls) == (3, 3)
    tool_msgs = [m["content"] for m in ep.messages if m["role"] == "tool"]
    assert tool_msgs[0].startswith("Error: arguments of read_file are not valid JSON")
    assert "unknown tool" in tool_msgs[1] and "unexpected argument" in tool_msgs[2]
    assert ep.reward.invalid_calls == pytest.approx(3 * cfg.reward_invalid_call)
    assert ep.reward.false_claim == 0.0  # "give up" hedges


def test_editing_tests_does_not_pay_and_limits_stop(task_env, cfg):
    import dataclasses
    task, d = task_env
    cheat = p.render_assistant("", [("write_file", {"file_path": "test_mod.py", "contents":
                                                    "import unittest\n"})])
    ep = run_episode(scripted(cheat, p.render_assistant("", [("finish", {"message": "Fixed."})])),
                     task, d, cfg)
    assert not ep.grade.resolved and ep.reward.false_claim == cfg.reward_false_claim
    assert ep.reward.outside_edits == cfg.reward_outside_edit
    short = dataclasses.replace(cfg, max_turns=2)
    ep = run_episode(scripted(p.render_assistant("", [("list_dir", {})])), task, d, short)
    assert ep.stop_reason == "max_turns" and ep.num_turns == 2


def test_token_counts_come_from_the_agent_or_a_tokenizer(task_env, cfg):
    from composer_jax.agent.episode import AgentTurn
    task, d = task_env
    text = p.render_assistant("", [("finish", {"message": "done"})])
    ep = run_episode(lambda m: AgentTurn(text, 7), task, d, cfg)
    assert ep.num_tokens == 7 and ep.token_count_source == "agent"
    ep = run_episode(lambda m: text, task, d, cfg, count_tokens=lambda s: 3)
    assert ep.num_tokens == 3 and ep.token_count_source == "tokenizer"
    ep = run_episode(lambda m: text, task, d, cfg)
    assert ep.num_tokens == len(text) // 4 and ep.token_count_source == "chars/4"
