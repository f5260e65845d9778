"""The sandboxed unittest runner: one-shot and fork-server modes give the same outcomes."""
import dataclasses

import pytest

from composer_jax.env.config import SandboxBackend
from composer_jax.env.pythons import get_python
from composer_jax.env.tasks.validate import Scratch

from env_helpers import needs_bwrap

pytestmark = needs_bwrap

MOD = "STATE = []\n\ndef add(a, b):\n    STATE.append(1)\n    return a + b\n"
TESTS = ("import unittest, time\nimport mod\n\n\nclass T(unittest.TestCase):\n"
         "    def test_add(self):\n        self.assertEqual(mod.add(1, 1), 2)\n\n"
         "    def test_fresh_state(self):\n        mod.add(0, 0)\n        self.assertEqual(len(mod.STATE), 1)\n\n"
         "    def test_fail(self):\n        self.assertEqual(1, 2)\n\n"
         "    def test_error(self):\n        raise KeyError('k')\n\n"
         "    def test_sub(self):\n        for i in range(3):\n            with self.subTest(i=i):\n"
         "                self.assertLess(i, 2)\n\n"
         "    @unittest.skip('no')\n    def test_skip(self):\n        pass\n\n"
         "    def test_hang(self):\n        time.sleep(60)\n")


@pytest.fixture(params=[False, True], ids=["cold", "warm"])
def sx(request, cfg):
    c = dataclasses.replace(cfg, fork_server=request.param, max_test_file_seconds=0.5)
    s = Scratch(get_python(cfg.python_versions[0]), SandboxBackend.BWRAP, c)
    s.write({"mod.py": MOD, "test_mod.py": TESTS})
    yield s
    s.close()


def test_outcomes_messages_and_module_origin(sx):
    ids = [f"test_mod.T.{n}" for n in ("test_add", "test_fail", "test_error", "test_sub", "test_skip")]
    run = sx.run(ids + ["test_mod.T.test_missing"], modules=("mod",))
    assert run.ok
    assert run.results == {"test_mod.T.test_add": "pass", "test_mod.T.test_fail": "fail",
                           "test_mod.T.test_error": "error", "test_mod.T.test_sub": "fail",
                           "test_mod.T.test_skip": "skip", "test_mod.T.test_missing": "error"}
    assert run.messages["test_mod.T.test_fail"] == "AssertionError: 1 != 2"
    assert run.modules["mod"] == sx.sandbox.workdir + "/mod.py"


def test_every_run_starts_clean_and_sees_new_files(sx):
    for _ in range(3):  # module state never leaks from one run into the next
        assert sx.run(["test_mod.T.test_fresh_state"]).results == {"test_mod.T.test_fresh_state": "pass"}
    sx.write({"mod.py": MOD.replace("a + b", "a - b")})
    assert sx.run(["test_mod.T.test_add"]).results == {"test_mod.T.test_add": "fail"}


def test_timeout_kills_and_next_run_recovers(sx):
    run = sx.run(["test_mod.T.test_hang"])
    assert not run.ok and "timed out" in run.detail and run.duration_s < 10
    assert sx.run(["test_mod.T.test_add"]).results == {"test_mod.T.test_add": "pass"}


def test_preloaded_stdlib_module_is_reimported_from_workspace(cfg):
    """difflib is imported by unittest itself; the runner must still test the workspace copy."""
    import pathlib
    py = get_python(cfg.python_versions[0])
    s = Scratch(py, SandboxBackend.BWRAP, cfg)
    try:
        s.write({"difflib.py": pathlib.Path(py.stdlib, "difflib.py").read_text() + "\nMARK = 1\n",
                 "test_x.py": "import unittest, difflib\n\nclass T(unittest.TestCase):\n"
                              "    def test_mark(self):\n        self.assertEqual(difflib.MARK, 1)\n"})
        run = s.run(["test_x.T.test_mark"], modules=("difflib",))
        assert run.results == {"test_x.T.test_mark": "pass"}
        assert run.modules["difflib"] == s.sandbox.workdir + "/difflib.py"
    finally:
        s.close()
