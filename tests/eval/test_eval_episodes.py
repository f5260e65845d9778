"""Scoring a token-level (model) episode: prompt/cached token accounting from the rollout's turns,
tool calls rebuilt from the recorded conversation, crashed episodes."""
from types import SimpleNamespace as NS

import pytest

from composer_jax.eval.episodes import calls_from_messages, facts_from_rollout, rollout_prompt_tokens
from composer_jax.eval.metrics import episode_price


def turn(fed_start, sample_start, sample_end, end=None):
    return NS(fed_start=fed_start, sample_start=sample_start, sample_end=sample_end,
              end=sample_end if end is None else end)


def test_prompt_and_cached_tokens_of_a_two_segment_episode():
    seg1 = [turn(0, 100, 120),            # first prompt: 100 fresh tokens
            turn(120, 150, 170),          # 120 held in the session's cache, 30 fed
            turn(171, 180, 200, 201)]     # previous turn cut: the agent's closing token is fed
    seg2 = [turn(0, 60, 70)]              # restart after a summary: nothing cached
    prompt, cached = rollout_prompt_tokens([seg1, seg2])
    assert prompt == 100 + 150 + 180 + 60
    assert cached == 0 + 120 + 170 + 0
    price = episode_price(prompt, cached, 20 + 20 + 20 + 10, prompt_per_mtok=1.0,
                          cached_per_mtok=0.1, generated_per_mtok=10.0)
    assert price == pytest.approx(((490 - 290) * 1.0 + 290 * 0.1 + 70 * 10.0) / 1e6)
    assert rollout_prompt_tokens([]) == (0, 0)


def _messages():
    a1 = {"role": "assistant", "content": "", "raw": "...",
          "tool_calls": [{"call_id": "functions.run_terminal_cmd:0", "name": "run_terminal_cmd",
                          "arguments": {"command": "python -m unittest"}, "error": None},
                         {"call_id": "functions.bad:1", "name": "?", "arguments": {},
                          "error": "malformed JSON"}]}
    t1 = {"role": "tool", "tool_call_id": "functions.run_terminal_cmd:0", "content": "OK",
          "is_error": False}
    t2 = {"role": "tool", "tool_call_id": "functions.bad:1", "content": "Error: malformed",
          "is_error": True}
    a2 = {"role": "assistant", "content": "", "raw": "...",
          "tool_calls": [{"call_id": "functions.search_replace:2", "name": "search_replace",
                          "arguments": {"file_path": "m.py", "old_string": "x",
                                        "new_string": "y"}, "error": None}]}
    t3 = {"role": "tool", "tool_call_id": "functions.search_replace:2", "content": "old_string "
          "not found", "is_error": True}
    return [[{"role": "system"}, {"role": "user"}, a1, t1, t2], [{"role": "user"}, a2, t3]]


def test_calls_rebuilt_from_the_conversation():
    calls = calls_from_messages(_messages())
    assert [c["name"] for c in calls] == ["run_terminal_cmd", "?", "search_replace"]
    assert [c["is_error"] for c in calls] == [False, True, True]
    assert calls[0]["output"] == "OK" and calls[1]["error"] == "malformed JSON"


def _rollout(error=None, **info):
    seg = NS(turns=(turn(0, 50, 60), turn(60, 80, 90)))
    base = {"messages": _messages(), "resolved": True, "f2p_passed": 2, "f2p_total": 2,
            "p2p_passed": 1, "p2p_total": 2, "p2p_failed": ["t.b"], "grader_ok": True,
            "changed_files": ["m.py"], "num_calls": 3, "num_invalid_calls": 1, "num_turns": 2,
            "generated_tokens": 20, "final_message": "done", "stop_reason": "finish"}
    base.update(info)
    return NS(info=base, segments=[seg], timing={"duration_s": 1.5}, error=error,
              total_reward=0.0 if error else 0.9, num_trainable=20)


def test_facts_from_a_rollout_and_from_a_crashed_one():
    f = facts_from_rollout(_rollout(), ["t.a", "t.b"])
    assert f.resolved and f.partial == 1.0 and f.p2p_failed == ("t.b",)
    assert (f.prompt_tokens, f.cached_prompt_tokens, f.generated_tokens) == (130, 60, 20)
    assert (f.num_calls, f.num_invalid_calls, f.turns, f.wall_s) == (3, 1, 2, 1.5)
    assert f.stop_reason == "finish" and f.reward == 0.9 and f.error is None
    info = {"messages": _messages()[:1], "stop_reason": "crashed", "num_turns": 1}
    crashed = facts_from_rollout(NS(info=info, segments=[], timing={}, error="boom",
                                    total_reward=0.0, num_trainable=7), ["t.a", "t.b"])
    assert not crashed.resolved and crashed.stop_reason == "error" and not crashed.grader_ok
    assert crashed.p2p_failed == ("t.a", "t.b") and crashed.generated_tokens == 7
    assert crashed.num_calls == 2 and crashed.num_invalid_calls == 1
