"""The grader stands behind a task only when it resolves the task's reference fix
(`env.tasks.reference_check`). Three ways an honest fix was failed in the level-1 pools, each now
graded resolved: a secret case whose output depended on the cases run before it in the process, a
secret case whose function forks, and an edit file the interpreter imports before the tests (its
installed copy, the snapshot's, broke traceback formatting). A task the grader still cannot resolve
is reported and removed.
"""
import json
import pathlib

import pytest

from composer_jax.env import secret
from composer_jax.env.config import EnvConfig
from composer_jax.env.pythons import find_pythons
from composer_jax.env.tasks.pool import TaskPool
from composer_jax.env.tasks.reference_check import GRADINGS, reference_problem
from composer_jax.env.tasks.reference_check import main as check_main
from composer_jax.env.tasks.task import Task
from composer_jax.env.workspace import open_workspace
from env_helpers import needs_bwrap

pytestmark = needs_bwrap

FIXED = '''"""A module with three kinds of public functions."""
import os

_made = [0]


def table(x):
    """Numbers its output by the tables made before it in the process (as HtmlDiff.make_table)."""
    _made[0] += 1
    return "t%d:%d" % (_made[0], 2 * x)


def spawn(argv):
    """Forks; on a short argv the child fails and comes back through the caller (as pty.spawn([]))."""
    pid = os.fork()
    if pid == 0:
        argv[1]
        os._exit(0)
    return os.waitpid(pid, 0)[1]


def double(x):
    return 2 * x
'''
BROKEN = (FIXED.replace("return 2 * x\n", "return x + x + 1\n")
          .replace("[1]\n\n\ndef double", "[1] + 1\n\n\ndef double")
          .replace('"t%d:%d" % (_made[0], 2 * x)', '"t%d:%d" % (_made[0], 3 * x)'))
TESTS = '''import unittest

import m


class T(unittest.TestCase):
    def test_double(self):
        for x in (1, 2, 5):
            self.assertEqual(m.double(x), 2 * x)

    def test_table(self):
        self.assertTrue(m.table(4).endswith(":8"))
        self.assertTrue(m.table(7).endswith(":14"))

    def test_spawn(self):
        self.assertEqual(m.spawn(["x", "y"]), 0)
        self.assertEqual(m.spawn(["a", "b", "c"]), 0)
'''
F2P = ("test_m.T.test_double", "test_m.T.test_spawn", "test_m.T.test_table")


def _python(version=None):
    pythons = find_pythons()
    if version is not None:
        if version not in pythons:
            pytest.skip(f"CPython {version} is not installed")
        return pythons[version]
    return max(pythons.values(), key=lambda p: tuple(map(int, p.version.split("."))))


def _task(root: pathlib.Path, task_id, module, edit, tests: dict, before, after, f2p, p2p, version):
    """A task directory by hand: snapshot (`before` and the test file `tests` {name: text}), solution."""
    d = root / task_id
    for sub, files in (("snapshot", {edit: before, **tests}), ("solution", {edit: after})):
        for rel, text in files.items():
            (d / sub / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / sub / rel).write_text(text)
    task = Task(task_id, "bug", "train", version, module, f"{f2p[0]} fails; fix {edit}", f2p, p2p, (edit,),
                tuple(tests), "", 2, version, version)
    (d / "task.json").write_text(json.dumps(task.to_json()))
    return task, d


def test_secret_cases_hold_only_outputs_a_correct_fix_reproduces(tmp_path):
    py = _python()
    task, d = _task(tmp_path, "t-secret", "m", "m.py", {"test_m.py": TESTS}, BROKEN, FIXED, F2P, (),
                    py.version)
    cfg = EnvConfig(python_versions=(py.version,), use_embeddings=False)
    with open_workspace(d / "snapshot", cfg, python_version=py.version, task=task) as ws:
        data = secret.build(ws, task, d)
    kept = {c["f"][1] for c in data["cases"]}
    # table's anchors depend on the cases before it: recorded in one order, checked in another,
    # none is kept; spawn's output is its parent's, never the forked child's exception
    assert "double" in kept and "table" not in kept, data
    spawns = [c for c in data["cases"] if c["f"][1] == "spawn"]
    assert any(len(c["args"][0][1]) < 2 for c in spawns), spawns      # a case whose child comes back
    assert all(c["out"][0] == "r" for c in spawns), spawns
    assert reference_problem(task, d, cfg) is None


TEXTWRAP_TESTS = '''import textwrap
import unittest


class T(unittest.TestCase):
    def test_indent(self):
        self.assertEqual(textwrap.indent("a\\nb\\n", "> "), "> a\\n> b\\n")

    def test_dedent(self):
        self.assertEqual(textwrap.dedent("  a\\n  b\\n"), "a\\nb\\n")
'''


def test_an_edit_file_the_interpreter_imports_first_is_graded_by_its_fixed_text(tmp_path):
    """unittest formats a traceback (textwrap.indent, from the installed copy: the snapshot's) for
    every dotted test id it resolves; the graded process rebinds the interpreter's modules to the
    workspace's textwrap once set up, so the reference fix is resolved."""
    py = _python("3.12")
    fixed = (pathlib.Path(py.stdlib) / "textwrap.py").read_text()
    broken = fixed + "\n\n_indent = indent\n\n\ndef indent(text, prefix, predicate=None):\n" \
                     "    return _indent(text, prefx, predicate)\n"
    task, d = _task(tmp_path, "t-textwrap", "textwrap", "textwrap.py", {"test_tw.py": TEXTWRAP_TESTS}, broken, fixed,
                    ("test_tw.T.test_indent",), ("test_tw.T.test_dedent",), py.version)
    cfg = EnvConfig(python_versions=(py.version,), use_embeddings=False)
    assert reference_problem(task, d, cfg) is None


GRADER_AWARE = '''import unittest

import m


class T(unittest.TestCase):
    def test_double(self):
        self.assertEqual(m.double(3), 6)

    def test_plain_process(self):  # tells the graded process apart: its module holds a recorder
        self.assertFalse([k for k in globals() if k.startswith("_cj")])
'''


def test_a_task_the_grader_cannot_resolve_is_reported_and_removed(tmp_path, capsys):
    py = _python()
    fixed = "def double(x):\n    return 2 * x\n"
    pool = TaskPool(tmp_path / "pool")
    task = Task("t-aware", "bug", "train", py.version, "m", "test_double fails; fix m.py", ("test_g.T.test_double",),
                ("test_g.T.test_plain_process",), ("m.py",), ("test_g.py",), "", 2, py.version, py.version)
    pool.add(task, {"m.py": fixed.replace("2 * x", "x"), "test_g.py": GRADER_AWARE}, {"m.py": fixed})
    cfg = EnvConfig(python_versions=(py.version,), use_embeddings=False)
    why = reference_problem(task, pool.task_dir(task.task_id), cfg)
    assert why and "test_g.T.test_plain_process" in why, why
    assert check_main([str(tmp_path / "pool"), "--remove"]) == 0
    out = capsys.readouterr().out
    assert "t-aware: the grader does not resolve the reference fix" in out and '"removed": 1' in out
    assert TaskPool(tmp_path / "pool").tasks() == [] and not pool.task_dir("t-aware").exists()
    assert GRADINGS >= 2
