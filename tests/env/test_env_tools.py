import os

import pytest

from composer_jax.env import open_workspace
from composer_jax.env.tools.schema import validate_arguments

from env_helpers import needs_bwrap

pytestmark = needs_bwrap


@pytest.fixture
def ws(sample_dir, cfg):
    with open_workspace(sample_dir, cfg) as w:
        yield w


def test_snapshot_is_never_modified(ws, sample_dir):
    assert not ws.call("write_file", {"file_path": "mod.py", "contents": "x = 1\n"}).is_error
    assert (sample_dir / "mod.py").read_text().startswith('"""A tiny module')
    assert ws.changed_files() == ["mod.py"]


def test_read_file_windows(ws):
    r = ws.call("read_file", {"target_file": "mod.py", "start_line": 4, "end_line": 6})
    assert not r.is_error
    lines = r.output.splitlines()
    assert lines[0] == "mod.py: lines 4-6 of 23 (truncated; 17 more lines)"
    assert lines[1] == "     4\tdef add(a, b):" and len(lines) == 4
    assert ws.call("read_file", {"target_file": "mod.py", "start_line": 99}).is_error
    assert ws.call("read_file", {"target_file": "mod.py", "start_line": 5, "end_line": 2}).is_error
    assert ws.call("read_file", {"target_file": "missing.py"}).is_error


def test_list_dir_and_file_search(ws):
    r = ws.call("list_dir", {"relative_workspace_path": "."})
    assert r.output.splitlines()[1] == "pkg/" and "mod.py (" in r.output
    assert ws.call("file_search", {"query": "**/*.txt"}).output == "pkg/notes.txt"
    assert ws.call("file_search", {"query": "tst_md"}).output.splitlines()[0] == "test_mod.py"
    assert ws.call("file_search", {"query": "zzz"}).output == "No files match 'zzz'"


def test_grep_search_caps_and_errors(ws):
    r = ws.call("grep_search", {"query": r"return \w+", "include_pattern": "*.py"})
    hits = r.output.splitlines()
    assert hits[0] == "mod.py:6:     return a + b" and len(hits) == 5
    assert ws.call("grep_search", {"query": "ALPHA", "case_sensitive": False}).output == \
        "pkg/notes.txt:1: alpha"
    assert ws.call("grep_search", {"query": "("}).is_error


def test_search_replace_rules(ws):
    r = ws.call("search_replace", {"file_path": "mod.py", "old_string": "return", "new_string": "yield"})
    assert r.is_error and "occurs 5 times" in r.output
    r = ws.call("search_replace", {"file_path": "mod.py", "old_string": "nope", "new_string": "x"})
    assert r.is_error and "not found" in r.output
    r = ws.call("search_replace", {"file_path": "mod.py", "old_string": "return a+b", "new_string": "x"})
    assert r.is_error
    r = ws.call("search_replace", {"file_path": "mod.py", "old_string": "    return a + b",
                                   "new_string": "    return b + a"})
    assert not r.is_error and r.output == "Edited mod.py: replaced 1 occurrence at line 6"
    r = ws.call("search_replace", {"file_path": "mod.py", "old_string": "hi", "new_string": "HI",
                                   "replace_all": True})
    assert r.output == "Edited mod.py: replaced 3 occurrences"
    assert "return b + a" in (ws.root / "mod.py").read_text()


def test_write_delete_and_sandbox_sees_edits(ws):
    assert ws.call("write_file", {"file_path": "new/dir/x.py", "contents": "print(6*7)\n"}).output == \
        "Created new/dir/x.py (1 lines)"
    r = ws.call("run_terminal_cmd", {"command": "python new/dir/x.py && echo more >> new/dir/x.py"})
    assert r.output == "42\n[exit code 0]"
    assert ws.call("delete_file", {"target_file": "new/dir/x.py"}).output == "Deleted new/dir/x.py"
    assert ws.call("delete_file", {"target_file": "new/dir/x.py"}).is_error
    assert ws.call("delete_file", {"target_file": "pkg"}).is_error


def test_run_terminal_cmd_exit_code_timeout_and_background(ws):
    assert ws.call("run_terminal_cmd", {"command": "exit 3"}).output == "[exit code 3]"
    r = ws.call("run_terminal_cmd", {"command": "sleep 5", "timeout": 1})
    assert "timed out" in r.output
    r = ws.call("run_terminal_cmd", {"command": "sleep 30", "is_background": True})
    assert r.output.startswith("Started background job 1")
    assert ws.call("run_terminal_cmd", {"command": "  "}).is_error


def test_test_runner_durations_are_zeroed_so_the_same_episode_sees_the_same_tokens(ws):
    """A unittest run prints its wall-clock time; the agent sees 0 there, so two runs of one
    command give the same text (and the same seed the same episode)."""
    slow = ("import time, unittest\nclass T(unittest.TestCase):\n    def test_a(self):\n"
            "        time.sleep(0.05)\nunittest.main()\n")
    ws.call("write_file", {"file_path": "t_slow.py", "contents": slow})
    runs = [ws.call("run_terminal_cmd", {"command": "python t_slow.py 2>&1"}).output for _ in range(2)]
    assert runs[0] == runs[1] and "Ran 1 test in 0.000s" in runs[0], runs
    echoed = ws.call("run_terminal_cmd", {"command": "echo 'took 0.05s'; echo '== 1 passed in 1.5s =='"})
    assert "took 0.05s" in echoed.output and "== 1 passed in 0.00s ==" in echoed.output


def test_finish(ws):
    r = ws.call("finish", {"message": "bye"})
    assert r.finished and r.output == "bye" and not r.is_error


@pytest.mark.parametrize("name,args,needle", [
    ("frobnicate", {}, "unknown tool"),
    ("read_file", "a.py", "must be a JSON object"),
    ("read_file", {}, "missing required"),
    ("read_file", {"target_file": "a", "bogus": 1}, "unexpected argument"),
    ("read_file", {"target_file": 5}, "must be string"),
    ("read_file", {"target_file": "a", "start_line": True}, "must be integer"),
    ("codebase_search", {"query": "q", "target_directories": [1]}, "array of strings"),
])
def test_malformed_calls_return_errors(ws, name, args, needle):
    r = ws.call(name, args)
    assert r.is_error and needle in r.output
    assert validate_arguments(name, args) is not None


def test_codebase_search_bm25(ws):
    r = ws.call("codebase_search", {"query": "clamp value between lo and hi"})
    first = r.output.splitlines()[0]
    assert first.startswith("mod.py:9-14  clamp")


def test_counts_calls_and_invalid_calls(ws):
    ws.call("list_dir", {})
    ws.call("nope", {})
    assert (ws.num_calls, ws.num_invalid_calls) == (2, 1)
    assert os.path.isdir(ws.root)
