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


def _exact_conversation():
    """A conversation whose assistant JSON spacing differs from json.dumps (what a model may
    sample), with a truncated call, a plain-text turn and tool results."""
    a1 = ("Reading.<|tool_calls_section_begin|><|tool_call_begin|>functions.read_file:0"
          "<|tool_call_argument_begin|>{\"target_file\":\"a.py\" }<|tool_call_end|>"
          "<|tool_calls_section_end|>")
    a2 = "Edit:<|tool_calls_section_begin|><|tool_call_begin|>functions.write_file:1" \
         "<|tool_call_argument_begin|>{\"file_path\": \"a.py\", \"conte"
    a3 = "Done, nothing else to do."
    return a1, a2, a3


def test_incremental_rendering_equals_whole_conversation():
    a1, a2, a3 = _exact_conversation()
    start = [{"role": "system", "content": p.SYSTEM_PROMPT}, {"role": "user", "content": "Fix a.py"}]
    t1 = [{"role": "tool", "tool_call_id": "functions.read_file:0", "content": "x = 1\n"}]
    t2 = [{"role": "tool", "tool_call_id": "functions.write_file:1", "content": "Error: cut off"},
          {"role": "user", "content": "Please go on."}]
    m1 = p.assistant_message(a1, p.parse_assistant(a1))
    m2 = p.assistant_message(a2, p.parse_assistant(a2, first_index=1))
    m3 = p.assistant_message(a3, p.parse_assistant(a3, first_index=2))
    pieces = (p.render_prompt(start, TOOL_SPECS) + a1 + p.IM_END + p.render_continuation(t1)
              + a2 + p.IM_END + p.render_continuation(t2) + a3 + p.IM_END)
    whole = p.render_prompt(start + [m1] + t1 + [m2] + t2 + [m3], TOOL_SPECS,
                            add_generation_prompt=False)
    assert pieces == whole
    # without `raw` the parsed call is re-serialised and the text differs from what was sampled
    m1_parsed = {k: v for k, v in m1.items() if k != "raw"}
    assert a1 not in p.render_prompt(start + [m1_parsed], TOOL_SPECS)
    assert m2["tool_calls"][0]["error"] and p.ASSISTANT_PROMPT == "<|im_assistant|>assistant<|im_middle|>"
