"""Renamed ladder demonstrations (`data.sft_rename`): consistent, copyable, never a held-out name."""
import random

from composer_jax.data.sft_rename import IDENT, copied_names, name_pool, renamed_messages


def _call(name, index, **arguments):
    return {"call_id": f"functions.{name}:{index}", "name": name, "arguments": arguments, "raw": "", "error": None}


def _conversation(new_word="dir_fd", message="name 'dr_fd' is not defined. Did you mean: 'dir_fd'?"):
    traceback = (f'  File "/workspace/glob.py", line 193, in _isdir\n    st = os.stat(pathname, dr_fd)\n'
                 f"NameError: {message}\n\nRan 1 test in 0.001s\n\nFAILED (errors=1)")
    return [
        {"role": "system", "content": "You are a coding assistant; glob is a word here too."},
        {"role": "user", "content": "Tests in test_glob.py are failing: `test_glob.GlobTests.test_recursive`."},
        {"role": "assistant", "content": "", "tool_calls": [_call(
            "run_terminal_cmd", 0, command="python -m unittest test_glob.GlobTests.test_recursive 2>&1 | tail -n 12")]},
        {"role": "tool", "tool_call_id": "functions.run_terminal_cmd:0", "content": traceback},
        {"role": "assistant", "content": "", "tool_calls": [_call(
            "read_file", 1, target_file="glob.py", start_line=193, end_line=193)]},
        {"role": "tool", "tool_call_id": "functions.read_file:1",
         "content": "glob.py: lines 193-193 of 237\n   193\t        st = os.stat(pathname, dr_fd)"},
        {"role": "assistant", "content": "", "tool_calls": [_call(
            "search_replace", 2, file_path="glob.py", old_string="        st = os.stat(pathname, dr_fd)\n",
            new_string=f"        st = os.stat(pathname, {new_word})\n")]},
        {"role": "tool", "tool_call_id": "functions.search_replace:2", "content": "Edited glob.py"},
        {"role": "assistant", "content": "", "tool_calls": [_call(
            "finish", 3, message="Fixed; the failing tests pass now.")]},
    ]


NAMES = [f"name_{a}{b}" for a in "abcdefgh" for b in "abcdefgh"]


def _assistant_words(messages):
    return [w for m in messages if m["role"] == "assistant" for c in m["tool_calls"]
            for v in c["arguments"].values() if isinstance(v, str) for w in IDENT.findall(v)]


def test_every_copied_name_and_the_read_line_are_replaced_consistently():
    original = _conversation()
    assert copied_names(original) == ["test_glob", "GlobTests", "test_recursive", "glob", "st", "os", "stat",
                                      "pathname", "dr_fd", "dir_fd"]
    renamed = renamed_messages(original, NAMES, random.Random(0))
    assert renamed[0] == original[0]                       # the system prompt is never touched
    mapping = {}
    for old, new in zip(_assistant_words(original), _assistant_words(renamed)):
        assert mapping.setdefault(old, new) == new          # one name per original, everywhere
    assert all(mapping[w] in NAMES for w in copied_names(original))
    assert len({mapping[w] for w in copied_names(original)}) == len(copied_names(original))
    assert mapping["python"] == "python" and mapping["unittest"] == "unittest"   # protocol words kept
    read = renamed[4]["tool_calls"][0]["arguments"]
    assert read["start_line"] == read["end_line"] != 193 and read["start_line"] >= 20
    line = read["start_line"]
    assert f"line {line}," in renamed[3]["content"] and f"   {line}\t" in renamed[5]["content"]
    assert "of 237" in renamed[5]["content"]              # only the read line's number moves
    # whatever the assistant writes, it saw first: every renamed word is in an earlier non-assistant message
    for i, m in enumerate(renamed):
        if m["role"] != "assistant":
            continue
        shown = set(IDENT.findall(" ".join(str(x["content"]) for x in renamed[1:i] if x["role"] != "assistant")))
        assert {mapping[w] for w in copied_names(original)} & set(_assistant_words([m])) <= shown


def test_a_fix_that_nothing_showed_keeps_its_names():
    original = _conversation(message="'dr_fd' is an invalid keyword argument for stat()")
    names = copied_names(original)
    assert "dr_fd" not in names and "dir_fd" not in names and "pathname" in names
    renamed = renamed_messages(original, NAMES, random.Random(1))
    edit = renamed[6]["tool_calls"][0]["arguments"]
    assert "dr_fd" in edit["old_string"] and "dir_fd" in edit["new_string"] and "pathname" not in edit["old_string"]


def test_different_seeds_give_different_names_and_too_few_names_is_an_error():
    a = renamed_messages(_conversation(), NAMES, random.Random(0))
    b = renamed_messages(_conversation(), NAMES, random.Random(1))
    assert a[2] != b[2]
    try:
        renamed_messages(_conversation(), NAMES[:3], random.Random(0))
    except ValueError as e:
        assert "unused candidate names" in str(e)
    else:
        raise AssertionError("too few names must raise")


def test_name_pool_never_holds_a_heldout_module_name():
    texts = ["import heapq\nheapq_push = 1\nmy_heap = 2\nA0000F8 = 3\nreturn_value = parse_args()\nx = 1"]
    pool = name_pool(texts, exclude=["heapq"])
    assert pool == ["my_heap", "parse_args", "return_value"]


def test_the_oracles_constant_words_are_never_renamed():
    # a renamed copy keeps the protocol: every word of the ladder oracle's constant commands and
    # finish message (PLAN_VERSION 5's grep included) is in KEEP, so only copied names change
    from composer_jax.data.sft_env import HASTY_FINISH
    from composer_jax.data.sft_rename import KEEP
    from composer_jax.env.tasks import ladder_plan as lp

    constant = [lp.first_error_command()["command"], lp.suite_command(lp.OUTPUT_LINES)["command"],
                lp.suite_command(lp.RERUN_LINES)["command"], lp.FINISH["message"], HASTY_FINISH["message"]]
    assert {w for text in constant for w in IDENT.findall(text)} - KEEP == set()
    messages = _conversation()
    messages[2]["tool_calls"][0]["arguments"]["command"] = lp.first_error_command()["command"]
    renamed = renamed_messages(messages, NAMES, random.Random(0))
    assert renamed[2]["tool_calls"][0]["arguments"]["command"] == lp.first_error_command()["command"]
