"""Quality measurements: replayed edits, new pyflakes warnings, diff size, scope and test edits."""
from composer_jax.eval.heuristic import count_failures, line_mutants, traceback_lines
from composer_jax.eval.quality import changed_lines, new_warnings, quality, replay_edits

SNAP = {"m.py": "import os\n\n\ndef f(x):\n    return os.sep + x\n", "test_m.py": "import m\n"}


def test_replay_and_quality_numbers():
    calls = [
        {"name": "search_replace", "arguments": {"file_path": "m.py", "old_string": "os.sep + x",
                                                  "new_string": "x + undefined_name"}},
        {"name": "search_replace", "arguments": {"file_path": "m.py", "old_string": "nope",
                                                  "new_string": "x"}, "is_error": True},
        {"name": "write_file", "arguments": {"file_path": "/workspace/extra.py", "contents": "y = 1\n"}},
        {"name": "write_file", "arguments": {"file_path": "test_m.py", "contents": "import m\nassert 1\n"}},
    ]
    final = replay_edits(SNAP, calls)
    assert final["m.py"] == "import os\n\n\ndef f(x):\n    return x + undefined_name\n"
    q = quality(SNAP, calls, ["extra.py", "m.py", "test_m.py"], ["m.py"], ["test_m.py"],
                reference_lines=2)
    # os is now unused and undefined_name is undefined: two new warnings in m.py
    assert q["new_pyflakes_warnings"] == 2
    assert q["diff_lines"] == 2 + 1 + 1 and q["diff_ratio"] == 2.0
    assert q["out_of_scope_files"] == 1 and q["out_of_scope_paths"] == ["extra.py"]
    assert q["test_edits"] == 1 and q["unreplayed_files"] == 0
    shell = quality(SNAP, [], ["m.py"], ["m.py"], ["test_m.py"], 2)
    assert shell["unreplayed_files"] == 1 and shell["diff_lines"] == 0


def test_new_warnings_is_a_multiset_difference():
    before = "import os\nimport sys\n"
    assert new_warnings(before, before + "\n", "a.py") == []
    assert len(new_warnings(before, before + "import re\n", "a.py")) == 1
    assert new_warnings(before, "def (:\n", "a.py")[0].startswith("syntax error")
    assert changed_lines("a\nb\n", "a\nc\nd\n") == 3


def test_heuristic_helpers():
    assert line_mutants("    if x < y:")[0] == "    if x <= y:"
    assert line_mutants("    if x < y:")[-1] == "    if not (x < y):"
    assert line_mutants("    if not (a.b):")[0] == "    if a.b:"
    assert "    return n + 2" in line_mutants("    return n + 1")
    assert count_failures("Ran 4 tests\nFAILED (failures=1, errors=2, skipped=3)") == 3
    assert count_failures("Ran 4 tests\n\nOK\n") == 0 and count_failures("boom") is None
    assert count_failures("      1 OK\n[exit code 0]") == 0
    out = ('      5   File "/workspace/m.py", line 7, in f\n'
           '      2   File "/workspace/m.py", line 3, in g\n'
           '      9   File "/workspace/test_m.py", line 3, in test\n')
    assert traceback_lines(out, ["m.py"]) == [("m.py", 7), ("m.py", 3)]
