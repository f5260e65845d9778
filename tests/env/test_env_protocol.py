import json

from composer_jax.env import protocol as p
from composer_jax.env.tools import TOOL_SPECS


def test_special_tokens_are_distinct_and_bracketed():
    assert len(set(p.SPECIAL_TOKENS)) == len(p.SPECIAL_TOKENS) == 10
    assert all(t.startswith("<|") and t.endswith("|>") for t in p.SPECIAL_TOKENS)


def test_render_prompt_layout():
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
            {"role": "assistant", "content": "ok", "tool_calls": [
                {"call_id": "functions.read_file:0", "name": "read_file",
                 "arguments": {"target_file": "a.py"}, "raw": "", "error": None}]},
            {"role": "tool", "tool_call_id": "functions.read_file:0", "content": "X"}]
    text = p.render_prompt(msgs, TOOL_SPECS)
    assert text.startswith("<|im_system|>tool_declare<|im_middle|>[")
    decl = text.split("<|im_middle|>", 1)[1].split("<|im_end|>", 1)[0]
    assert [t["name"] for t in json.loads(decl)][0] == "read_file"
    assert ("<|im_assistant|>assistant<|im_middle|>ok<|tool_calls_section_begin|><|tool_call_begin|>"
            "functions.read_file:0<|tool_call_argument_begin|>{\"target_file\": \"a.py\"}"
            "<|tool_call_end|><|tool_calls_section_end|><|im_end|>") in text
    assert "<|im_system|>tool<|im_middle|>## Return of functions.read_file:0\nX<|im_end|>" in text
    assert text.endswith("<|im_assistant|>assistant<|im_middle|>")


def test_roundtrip_two_calls():
    text = p.render_assistant("thinking", [("list_dir", {}), ("grep_search", {"query": "x+"})],
                              first_index=3)
    turn = p.parse_assistant(text, first_index=3)
    assert turn.content == "thinking"
    assert [(c.call_id, c.name, c.arguments, c.error) for c in turn.tool_calls] == [
        ("functions.list_dir:3", "list_dir", {}, None),
        ("functions.grep_search:4", "grep_search", {"query": "x+"}, None)]


def test_no_tool_call_is_plain_content():
    turn = p.parse_assistant("All done.<|im_end|>")
    assert turn.content == "All done." and turn.tool_calls == ()


def test_garbled_and_partial_calls_become_errors():
    b, a, e = p.TOOL_CALL_BEGIN, p.TOOL_CALL_ARG_BEGIN, p.TOOL_CALL_END
    cases = {
        "bad json": p.TOOL_CALLS_BEGIN + b + "functions.read_file:0" + a + "{target: 1}" + e,
        "cut off": p.TOOL_CALLS_BEGIN + b + "functions.read_file:0" + a + '{"target_file": "a',
        "no args token": p.TOOL_CALLS_BEGIN + b + "functions.read_file:0" + e,
        "array args": p.TOOL_CALLS_BEGIN + b + "functions.read_file:0" + a + "[1, 2]" + e,
        "bad id": p.TOOL_CALLS_BEGIN + b + "!!!" + a + "{}" + e,
        "empty section": p.TOOL_CALLS_BEGIN + "junk" + p.TOOL_CALLS_END,
    }
    for what, text in cases.items():
        turn = p.parse_assistant(text)
        assert len(turn.tool_calls) == 1, what
        assert turn.tool_calls[0].arguments is None and turn.tool_calls[0].error, what
    assert "cut off" in p.parse_assistant(cases["cut off"]).tool_calls[0].error


def test_call_without_section_tokens_is_still_parsed():
    text = "sure " + p.render_tool_call("finish", {"message": "m"}, 0)
    turn = p.parse_assistant(text)
    assert turn.content == "sure" and turn.tool_calls[0].arguments == {"message": "m"}
