"""The grader's parts without a sandbox: canonical values, assertion instrumentation, the parent's
re-evaluation and verdicts (no child flag relaxes a check), the bounded parent process, the
applied-changes rules (new package modules applied, no word scan), secret-case comparison and
held-back test removal, the secret-case builder's determinism rule."""
import json
import os
import time
import types
import unittest

import pytest

from composer_jax.env import graded_unittest as gu
from composer_jax.env import bounded
from composer_jax.env import secret
from composer_jax.env.tamper import Rules, collect_changes, decode_source
from composer_jax.env.tasks.task import Task
from composer_jax.env.verdict import (compare_cases, evaluate, judge, read_records,
                                      reference_summary, same_output)


def _obs(name, *args, site=1, **extra):
    return ["a", site, name, [gu.canon(a) for a in args], {k: gu.canon(v) for k, v in extra.items()}]


def test_canon_uses_exact_builtin_types_only():
    class Liar(str):
        def __eq__(self, other):
            return True

        def __repr__(self):
            return "'expected'"
    assert gu.canon([1, "a", (2.5, None), {"k": b"x"}, {3}]) == [
        "l", [["i", "1"], ["s", "a"], ["t", [["f", "2.5"], ["N"]]],
              ["d", [[["s", "k"], ["y", "78"]]]], ["S", [["i", "3"]]]]]
    assert gu.canon(Liar("x")) == ["o", f"{__name__}.test_canon_uses_exact_builtin_types_only."
                                        f"<locals>.Liar"]
    assert gu.canon(list(range(10 * gu.MAX_NODES)))[1][-1] == ["o", "<too large>"]
    assert gu.canon("z" * (gu.MAX_STR + 1))[0] == "H"


def test_parent_reevaluates_assertions_from_recorded_values():
    sites, methods, unverifiable = evaluate([
        _obs("assertEqual", [1, 2], [1, 2], site=1),
        _obs("assertEqual", "a", "b", site=2),
        _obs("assertTrue", [], site=3),
        _obs("assertAlmostEqual", 1.0, 1.0 + 1e-9, site=4),
        _obs("assertIn", 2, {1: "x", 2: "y"}, site=5),
        _obs("assertEqual", object(), 1, site=6),          # opaque: not verifiable
        ["e", 7, ["builtins.ValueError"]], ["r", 7, ["builtins.ValueError", "builtins.Exception"]],
        ["e", 8, ["builtins.KeyError"]], ["r", 8, None],
        ["i", 9, "assertIsInstance", ["builtins.bool", "builtins.int"], ["builtins.int"]],
        ["t", 10, gu.canon(0)]])
    assert sites == {"1": True, "2": False, "3": False, "4": True, "5": True, "7": True,
                     "8": False, "9": True, "10": False}
    assert unverifiable == 1 and methods["7"] == "raises" and methods["1"] == "assertEqual"


def test_judge_trusts_the_child_only_to_lower_the_verdict():
    ref = reference_summary({"status": "pass", "obs": [_obs("assertEqual", 1, 1, site=1),
                                                        _obs("assertTrue", True, site=2)]})
    good = {"status": "pass", "obs": [_obs("assertEqual", 1, 1, site=1),
                                      _obs("assertTrue", 5, site=2)]}
    assert judge(good, ref).passed
    assert not judge(dict(good, status="fail"), ref).passed
    lie = {"status": "pass", "obs": [_obs("assertEqual", 1, 2, site=1), _obs("assertTrue", 1, site=2)]}
    v = judge(lie, ref)
    assert not v.passed and v.forged
    skipped = {"status": "pass", "obs": [_obs("assertEqual", 1, 1, site=1)]}
    v = judge(skipped, ref)
    assert not v.passed and not v.forged and "not reached" in v.reason
    swapped = {"status": "pass", "obs": [_obs("assertEqual", 1, 1, site=1),
                                         _obs("assertEqual", 2, 2, site=2)]}
    assert not judge(swapped, ref).passed  # site 2 checks assertTrue in the reference
    assert not judge(None, ref).passed and not judge({"duplicate": True}, ref).passed
    exempt = reference_summary({"status": "pass", "obs": [_obs("assertEqual", 1, 2, site=1)]})
    assert judge({"status": "pass", "obs": [_obs("assertEqual", 1, 2, site=1)]}, exempt).passed


def test_equality_values_alike_in_two_reference_runs_are_pinned():
    run = {"status": "pass", "obs": [_obs("assertEqual", [2, 4], [2, 4], site=1),
                                     _obs("assertEqual", 0.25, 0.5, site=2)]}
    again = {"status": "pass", "obs": [_obs("assertEqual", [2, 4], [2, 4], site=1),
                                       _obs("assertEqual", 0.75, 0.5, site=2)]}  # not stable
    ref = reference_summary(run, again)
    assert set(ref["pinned"]) == {"1"}
    same = {"status": "pass", "obs": [_obs("assertEqual", [2, 4], [2, 4], site=1),
                                      _obs("assertEqual", 0.5, 0.5, site=2)]}
    assert judge(same, ref).passed
    rewritten = {"status": "pass", "obs": [_obs("assertEqual", [1, 2], [1, 2], site=1),
                                           _obs("assertEqual", 0.5, 0.5, site=2)]}
    v = judge(rewritten, ref)
    assert not v.passed and "other values" in v.reason and not v.forged


def test_read_records_keeps_only_the_nonce_and_flags_duplicates():
    text = ("noise\n@@CJ_OBS@@abc:{\"id\": \"t.A.x\", \"status\": \"pass\", \"obs\": []}\n"
            "@@CJ_OBS@@zzz:{\"id\": \"t.A.y\", \"status\": \"pass\", \"obs\": []}\n"
            "@@CJ_OBS@@abc:{\"id\": \"t.A.x\", \"status\": \"pass\", \"obs\": []}\n"
            "@@CJ_OBS@@abc:{\"done\": true}\n")
    records, done, notes = read_records(text, "abc")
    assert done and set(records) == {"t.A.x"} and records["t.A.x"] == {"duplicate": True}
    assert len(notes) == 2


SAMPLE_TESTS = '''import unittest


class T(unittest.TestCase):
    def test_a(self):
        self.assertEqual(sorted([3, 1]), [1, 3])
        assert len("ab") == 2
        with self.assertRaises(ValueError):
            int("x")
        self.assertRaises(KeyError, {}.__getitem__, 1)

    def test_line(self):
        import inspect
        self.assertEqual(inspect.currentframe().f_lineno, 14)
'''


def test_instrumented_tests_record_what_their_assertions_compare(tmp_path, monkeypatch):
    import ast
    rec = gu.Recorder()
    tree = gu.instrument(ast.parse(SAMPLE_TESTS), "_rec")  # sites ":1", ":2", ...
    ns = {"_rec": rec, "__name__": "sample"}
    exec(compile(tree, "sample.py", "exec"), ns)
    outs = {}
    for name in ("test_a", "test_line"):
        rec.current, rec.obs = name, []
        result = unittest.TestResult()
        ns["T"](name).run(result)
        assert result.wasSuccessful(), result.errors + result.failures
        outs[name] = rec.obs
    sites, methods, _ = evaluate(outs["test_a"])
    assert all(sites.values()) and len(sites) == 4
    assert sorted(methods.values()) == ["assert", "assertEqual", "raises", "raises"]
    assert evaluate(outs["test_line"])[0] == {":5": True}  # line numbers are the source's


def test_dump_writes_json_without_the_json_module():
    import json
    dump = gu.make_dump(json.encoder.encode_basestring_ascii)
    rec = {"id": "a.b", "obs": [["a", 1, "assertEqual", [["s", "\u00e9\n"], ["B", True]], {}]],
           "truncated": False, "n": None}
    assert json.loads(dump(rec)) == rec


def test_a_truncated_record_skips_no_check():
    """An empty record claiming a pass with `truncated` set fails: the flag is the child's."""
    ref = reference_summary({"status": "pass", "obs": [_obs("assertEqual", 1, 1, site=1)]},
                            {"status": "pass", "obs": [_obs("assertEqual", 1, 1, site=1)]})
    for rec in ({"status": "pass", "obs": [], "truncated": True},
                {"status": "pass", "obs": [_obs("assertEqual", 2, 2, site=1)], "truncated": True},
                {"status": "pass", "truncated": 1}):
        assert not judge(rec, ref).passed, rec


def test_regex_patterns_come_only_from_the_reference():
    """The parent never matches a pattern only the child supplied (exponential backtracking)."""
    ref = reference_summary({"status": "pass", "obs": [_obs("assertRegex", "abc", "b+", site=1)]})
    assert judge({"status": "pass", "obs": [_obs("assertRegex", "xbbx", "b+", site=1)]}, ref).passed
    evil = "(a+)+$"
    t = time.monotonic()
    v = judge({"status": "pass", "obs": [_obs("assertRegex", "a" * 40 + "!", evil, site=1)]}, ref)
    assert not v.passed and time.monotonic() - t < 1.0
    assert evaluate([_obs("assertRegex", "a" * 40 + "!", evil, site=1)])[2] == 1  # unverifiable


def test_count_equal_counts_linearly():
    big = [[i % 7, "x"] for i in range(1300)]  # within the node budget of a recorded value
    t = time.monotonic()
    sites, _, _ = evaluate([_obs("assertCountEqual", big, list(reversed(big)), site=1),
                            _obs("assertCountEqual", [1, [2]], [[2], 1.0], site=2),
                            _obs("assertCountEqual", [1, 1, 2], [1, 2, 2], site=3)])
    assert sites == {"1": True, "2": True, "3": False}
    assert time.monotonic() - t < 10


def test_parent_evaluation_runs_bounded_in_its_own_process():
    import json
    ok = bounded.judge_output("@@CJ_OBS@@n:" + '{"id": "t.A.x", "status": "pass", "obs": []}\n'
                              "@@CJ_OBS@@n:{\"done\": true}\n", "n", {}, ["t.A.x", "t.A.y"])
    assert ok["finished"] and ok["verdicts"]["t.A.x"][0] and not ok["verdicts"]["t.A.y"][0]
    deep = "@@CJ_OBS@@n:" + "[" * 100_000 + "\n"
    assert not bounded.judge_output(deep, "n", {}, ["t"])["finished"]
    # even a reference's own pattern may backtrack on what the child wrote: the evaluator is
    # killed at its deadline, and the next request gets a fresh one
    ref = reference_summary({"status": "pass", "obs": [_obs("assertRegex", "aa", "(a+)+$")]})
    slow = ("@@CJ_OBS@@n:" + json.dumps({"id": "t", "status": "pass", "obs": [
        _obs("assertRegex", "a" * 40 + "!", "(a+)+$")]}) + "\n")
    t = time.monotonic()
    with pytest.raises(bounded.EvaluationOverrun, match="longer than"):
        bounded.judge_output(slow, "n", {"t": ref}, ["t"], timeout_s=1.0)
    assert time.monotonic() - t < 5
    assert bounded.judge_output(deep, "n", {}, ["t"])["finished"] is False
    with pytest.raises(bounded.EvaluationOverrun, match="memory"):
        bounded.judge_output("x" * (64 << 20), "n", {}, ["t"], memory_bytes=64 << 20)


def test_secret_outputs_are_compared_as_data():
    ret = ["r", gu.canon([1, 2]), [gu.canon("a")]]
    assert same_output(["r", gu.canon([1, 2]), [gu.canon("a")]], ret)
    assert not same_output(["r", gu.canon((1, 2)), [gu.canon("a")]], ret)  # list != tuple
    assert not same_output(["r", ["o", "x.Liar"], [gu.canon("a")]], ret)   # opaque never equal
    assert not same_output(["r", gu.canon([1, 2]), [gu.canon("b")]], ret)  # argument mutated
    exc = ["e", ["builtins.ValueError", "builtins.Exception", "builtins.BaseException"]]
    assert same_output(["e", ["mod.MyError", "builtins.ValueError", "builtins.Exception"]], exc)
    assert not same_output(["e", ["builtins.TypeError", "builtins.Exception"]], exc)
    universal = ["mod.Any", "builtins.TypeError", "builtins.ValueError", "builtins.Exception"]
    assert not same_output(["e", universal], exc)  # one class deriving from them all
    third = ["r", gu.canon({"x": [0.1 + 0.2, 1]}), []]
    assert same_output(["r", gu.canon({"x": [0.3, 1.0]}), []], third)  # rounding, 1 == 1.0
    assert not same_output(["r", gu.canon({"x": [0.3001, 1]}), []], third)
    assert not same_output("garbage", ret) and not same_output(["r"], ret)
    out = ("@@CJ_CASE@@k:" + '{"i": 0, "out": ["r", ["i", "1"], []]}\n'
           "@@CJ_CASE@@k:" + '{"i": 1, "out": ["r", ["i", "5"], []]}\n'
           "@@CJ_CASE@@k:" + '{"i": 1, "out": ["r", ["i", "2"], []]}\n'  # a second answer
           "@@CJ_CASE@@zz:" + '{"i": 2, "out": ["r", ["i", "3"], []]}\n@@CJ_CASE@@k:{"done": 1}\n')
    res = compare_cases(out, "k", [["r", ["i", "1"], []], ["r", ["i", "2"], []],
                                   ["r", ["i", "3"], []]])
    assert res == {"finished": True, "passed": [True, False, False]}


def test_held_back_tests_are_removed_from_the_agents_copy():
    import ast
    import random
    from composer_jax.env.tasks import holdback
    text = ("import unittest\n\nclass A(unittest.TestCase):\n    def test_a(self):\n"
            "        self.assertEqual(1, 1)\n\n    @unittest.skipIf(False, 'x')\n"
            "    def test_b(self):\n        self.assertTrue(1)\n\nclass B(A):\n    pass\n\n"
            "class C(unittest.TestCase):\n    def test_c(self):\n        pass\n")
    mods = {"test_m": "test_m.py"}
    f2p = ["test_m.A.test_a", "test_m.A.test_b", "test_m.C.test_c"]
    held = holdback.choose(f2p, {"test_m.py": text}, mods, random.Random(1))
    assert held == ("test_m.C.test_c",)  # A's tests are inherited by B: not removable alone
    out = holdback.strip({"test_m.py": text}, held, mods)["test_m.py"]
    ast.parse(out)
    assert "test_c" not in out and "class C(unittest.TestCase):\n    pass" in out
    assert "test_a" in out and "test_b" in out
    assert holdback.choose(f2p[:1], {"test_m.py": text}, mods, random.Random(1)) == ()


def test_only_utf8_sources_are_read():
    assert decode_source(b"x = 1\n") == "x = 1\n"
    assert decode_source(b"\xef\xbb\xbfx = 1\n") == "x = 1\n"
    assert decode_source(b"# coding: latin-1\nx = '\xe9'\n") is None
    assert decode_source(b"# -*- coding: utf-7 -*-\nx = 1\n") is None


def test_collect_changes_applies_only_the_snapshots_sources(tmp_path):
    snap, ws = tmp_path / "snap", tmp_path / "ws"
    for root in (snap, ws):
        (root / "pkg").mkdir(parents=True)
        (root / "mod.py").write_text("def f():\n    return 1\n")
        (root / "test_mod.py").write_text("import mod\n")
        (root / "pkg" / "data.txt").write_text("x\n")
        (root / "pkg" / "other.py").write_text("Y = 1\n")
    (ws / "mod.py").write_text("def f():\n    return 2\n")
    (ws / "test_mod.py").write_text("# gutted\n")
    (ws / "helper.py").write_text("X = 1\n")
    (ws / "sitecustomize.py").write_text("pass\n")
    (ws / "x.pth").write_text("import os\n")
    (ws / "__pycache__").mkdir()
    (ws / "__pycache__" / "test_mod.cpython-312.pyc").write_bytes(b"\0" * 16)
    (ws / "ext.cpython-312-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    os.link(ws / "mod.py", ws / "mod.py.bak")
    (ws / "pkg" / "data.txt").write_text("y\n")
    (ws / "pkg" / "other.py").unlink()
    os.symlink("/etc/passwd", ws / "pkg" / "other.py")
    (ws / "json.py").write_text("X = 1\n")                 # would shadow the stdlib
    (ws / "tests").mkdir()
    (ws / "tests" / "helper.py").write_text("X = 1\n")    # test-like directory
    (ws / "test_extra.py").write_text("X = 1\n")
    (ws / "pkg" / "new.py").write_text("Z = 1\n")          # a new module in a package dir
    (ws / "bad.py").write_bytes(b"# coding: latin-1\nx = '\xe9'\n")
    rules = Rules(frozenset({"test_mod.py"}), frozenset({"mod.py"}), frozenset({"json"}))
    ch = collect_changes(ws, snap, rules)
    assert ch.applied == {"mod.py": b"def f():\n    return 2\n", "helper.py": b"X = 1\n",
                          "pkg/new.py": b"Z = 1\n"}
    assert set(ch.added) == {"helper.py", "pkg/new.py"}
    ignored = dict(ch.ignored)
    assert "shadow" in ignored["json.py"] and ignored["tests/helper.py"].startswith("new test")
    assert ignored["test_extra.py"].startswith("new test") and "UTF-8" in ignored["bad.py"]
    assert ignored["sitecustomize.py"].startswith("interpreter")
    assert ignored["test_mod.py"].startswith("test file") and ignored["x.pth"].startswith(
        "interpreter") and ignored["ext.cpython-312-x86_64-linux-gnu.so"] == "extension module"
    assert ignored["pkg/other.py"] == "symlink" and "not a Python module" in ignored["mod.py.bak"]
    assert ignored["pkg/data.txt"] == "not a Python source file"
    assert set(ch.edited) == {"mod.py", "test_mod.py", "pkg/data.txt", "pkg/other.py"}


@pytest.mark.parametrize("size_mb", [3])
def test_oversized_sources_are_dropped_not_read(tmp_path, size_mb):
    snap, ws = tmp_path / "snap", tmp_path / "ws"
    for root in (snap, ws):
        root.mkdir()
        (root / "mod.py").write_text("A = 1\n")
    (ws / "mod.py").write_text("A = 2\n" + "#" * (size_mb << 20))
    ch = collect_changes(ws, snap, Rules(frozenset(), frozenset({"mod.py"}), frozenset()))
    assert ch.applied == {} and "larger than" in dict(ch.ignored)["mod.py"]


def test_edit_files_the_graded_process_imports_first_stay_the_snapshots():
    """Agent code must not run before the graded process is set up: an edit file it imports
    itself (unittest's and json's dependencies) keeps the snapshot's version at its installed
    path; the tests still import the workspace copy."""
    import types
    from composer_jax.env.graded_run import trusted_edit_files
    from composer_jax.env.pythons import find_pythons
    py = max(find_pythons().values(), key=lambda p: tuple(map(int, p.version.split("."))))
    task = types.SimpleNamespace(edit_files=("fnmatch.py", "difflib.py", "graphlib.py",
                                             "json/decoder.py", "simplejson/decoder.py"))
    assert trusted_edit_files(task, py.executable) == {"fnmatch.py", "difflib.py",
                                                       "json/decoder.py"}


def test_secret_case_targets_are_the_public_code_a_fix_reaches():
    from composer_jax.env.secret import perturb, targets
    before = ("def f(x):\n    return _g(x)\n\ndef _g(x):\n    return x\n\ndef h(x):\n    return x\n\n"
              "class C:\n    def __init__(self, n):\n        self.n = n\n"
              "    def get(self):\n        return self.n\n    def __getitem__(self, k):\n"
              "        return k\n    @property\n    def p(self):\n        return 1\n\n"
              "class D:\n    def m(self):\n        return self._k()\n    def _k(self):\n"
              "        return 1\n    def gen(self):\n        yield 1\n")
    after = (before.replace("    return x\n\ndef h", "    return x + 1\n\ndef h")
             .replace("self.n = n", "self.n = n + 1").replace("        return 1\n    def gen",
                                                              "        return 2\n    def gen"))
    assert targets({"m.py": before}, {"m.py": after}) == [
        ("m", "C.__getitem__"), ("m", "C.get"), ("m", "D.m"), ("m", "f")]
    import random
    case = {"f": ["m", "C.get"], "init": [[["i", "3"]], []], "args": [], "kwargs": []}
    variants = perturb(case, random.Random(0))
    assert variants and all(v["init"] != case["init"] for v in variants)


def test_new_top_level_modules_may_not_shadow_extension_modules():
    from composer_jax.env.pythons import find_pythons
    from composer_jax.env.tamper import stdlib_module_names
    py = max(find_pythons().values(), key=lambda p: tuple(map(int, p.version.split("."))))
    names = stdlib_module_names(py.stdlib)
    assert {"json", "unittest", "os", "array", "_json"} <= names


def test_secret_cases_drop_every_case_of_a_function_whose_outputs_vary(tmp_path, monkeypatch):
    """A random function agrees across reference runs on some inputs by luck (`randbelow(1)`
    always, `randbelow(2)` half the time): a case kept from it would fail a correct fix at
    grading. Any case differing between runs drops every case of that function but those raising
    the same exception in every run."""
    for d, roll, double in (("snapshot", "0", "x"), ("solution", "n", "2 * x")):
        (tmp_path / d).mkdir()
        (tmp_path / d / "m.py").write_text(f"def roll(n):\n    return {roll}\n\n"
                                           f"def double(x):\n    return {double}\n")
    task = Task("t", "bug", "train", "3.12", "m", "", ("test_m.T.test",), (), ("m.py",),
                ("test_m.py",), "", 2, "3.12", "3.12")
    calls = [{"f": ["m", "roll"], "args": [["i", "1"]], "kwargs": []},
             {"f": ["m", "roll"], "args": [["i", "1000"]], "kwargs": []},
             {"f": ["m", "roll"], "args": [["i", "-5"]], "kwargs": []},
             {"f": ["m", "double"], "args": [["i", "3"]], "kwargs": []}]
    runs = []

    def fake_child(ws, task, snapshot, files, request, timeout_s, max_output_bytes=0):
        return "".join(f"@@CJ_CASE@@{request['nonce']}:{json.dumps(c)}\n" for c in calls), False

    def fake_outputs(ws, task, snapshot, files, cases, timeout_s):
        fixed = "m.py" in files
        runs.append(fixed)
        k = len(runs)
        outs = []
        for c in cases:
            x = int(c["args"][0][1])
            if c["f"][1] == "roll" and fixed and x < 0:
                outs.append(["e", ["builtins.ValueError", "builtins.Exception"]])
                continue
            if c["f"][1] == "roll":  # "random": run k draws k mod n (always 0 for n = 1)
                y = (k * 7919) % max(abs(x), 1) if fixed else 0
            else:
                y = 2 * x if fixed else x
            outs.append(["r", ["i", str(y)], [c["args"][0]]])
        return outs, 0.01, 100
    monkeypatch.setattr(secret, "run_child", fake_child)
    monkeypatch.setattr(secret, "_outputs", fake_outputs)
    data = secret.build(types.SimpleNamespace(), task, tmp_path, timeout_s=5.0)
    # REFERENCE_RUNS recording runs, then one order_free round (forward and reversed) that drops nothing
    assert runs.count(True) == secret.REFERENCE_RUNS + 2 and secret.REFERENCE_RUNS >= 3 and runs.count(False) == 1
    assert data["nondeterministic"] == [["m", "roll"]]
    rolls = [c for c in data["cases"] if c["f"][1] == "roll"]
    assert rolls and all(c["out"][0] == "e" for c in rolls), rolls  # roll(1) agreed: dropped too
    assert {c["f"][1] for c in data["cases"]} == {"double", "roll"}
    assert all(c["discriminating"] for c in data["cases"])


def test_tests_that_draw_their_data_draw_the_same_in_every_graded_run(tmp_path):
    """A test drawing random sizes (test_heapq.test_merge: up to 2,500 tuples) had its values over
    the canonical-value budget in some runs and not others, so a site both reference runs verified
    was, in 1 of 12 gradings of the reference itself, not reached with verifiable values. The graded
    process seeds `random` by test id: every run draws the same data."""
    import subprocess
    import sys as _sys
    (tmp_path / "test_r.py").write_text(
        "import random\nimport unittest\n\nSIZE = random.randrange(10 ** 6)\n\n\n"
        "class T(unittest.TestCase):\n"
        "    def test_a(self):\n        self.assertIsNotNone([SIZE, random.random()])\n\n"
        "    def test_b(self):\n        self.assertIsNotNone(random.randrange(10 ** 9))\n")

    def observations():
        req = json.dumps({"nonce": "n", "modules": ["test_r"], "edited": []})
        out = subprocess.run([_sys.executable, gu.__file__, "test_r.T.test_a", "test_r.T.test_b"], input=req + "\n",
                             capture_output=True, text=True, cwd=tmp_path, timeout=60).stdout
        records = [json.loads(line.split(":", 1)[1]) for line in out.splitlines() if line.startswith("@@CJ_OBS@@n:")]
        return {r["id"]: r["obs"] for r in records if "id" in r}

    first, second = observations(), observations()
    assert set(first) == {"test_r.T.test_a", "test_r.T.test_b"}
    assert first == second
    assert first["test_r.T.test_a"] != first["test_r.T.test_b"]
