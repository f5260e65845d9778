"""Installed packages with their own test suites as task sources (`tasks/sources.py`)."""
import dataclasses
import importlib.util
import json
import pathlib
import sys

import pytest

import composer_jax.heldout
from composer_jax.agent.episode import run_episode
from composer_jax.env.check import check_pool
from composer_jax.env.config import EnvConfig, SandboxBackend, Split
from composer_jax.env.pythons import find_pythons
from composer_jax.env.tasks.generate import baseline, fast_classes, generate_pool
from composer_jax.env.tasks.pool import TaskPool
from composer_jax.env.tasks.sources import ModuleSource, discover_packages, package_search_dirs
from composer_jax.env.tasks.validate import Scratch, addressable

from env_helpers import needs_bwrap

CORE = '''"""Small utilities."""


def clamp(x, lo, hi):
    """Clamp x into [lo, hi]."""
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def mean(values):
    """Arithmetic mean of a non-empty sequence."""
    total = 0
    count = 0
    for v in values:
        total += v
        count += 1
    return total / count


def chunks(seq, n):
    """Split seq into lists of n items (the last may be shorter)."""
    out = []
    for i in range(0, len(seq), n):
        out.append(list(seq[i:i + n]))
    return out
'''

TESTS = '''import unittest

from toypkg import core


class TestClamp(unittest.TestCase):
    def test_low(self):
        self.assertEqual(core.clamp(-5, 0, 3), 0)

    def test_high(self):
        self.assertEqual(core.clamp(7, 0, 3), 3)

    def test_inside(self):
        self.assertEqual(core.clamp(2, 0, 3), 2)

    def test_edges(self):
        self.assertEqual(core.clamp(0, 0, 3), 0)
        self.assertEqual(core.clamp(3, 0, 3), 3)


class TestMean(unittest.TestCase):
    def test_ints(self):
        self.assertEqual(core.mean([1, 2, 3, 6]), 3)

    def test_single(self):
        self.assertEqual(core.mean([5]), 5)


class TestChunks(unittest.TestCase):
    def test_even(self):
        self.assertEqual(core.chunks([1, 2, 3, 4], 2), [[1, 2], [3, 4]])

    def test_ragged(self):
        self.assertEqual(core.chunks([1, 2, 3], 2), [[1, 2], [3]])

    def test_empty(self):
        self.assertEqual(core.chunks([], 3), [])
'''


def _newest():
    return max(find_pythons(), key=lambda v: tuple(map(int, v.split("."))))


@pytest.fixture
def site(tmp_path) -> pathlib.Path:
    """A site-packages-like directory with `toypkg` 1.2.3 (metadata, tests, a fake extension)."""
    root = tmp_path / "site"
    pkg = root / "toypkg"
    (pkg / "tests").mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""Toy package."""\nfrom toypkg.core import clamp, mean\n')
    (pkg / "core.py").write_text(CORE)
    (pkg / "_private.py").write_text("X = 1\n")
    (pkg / "__main__.py").write_text("print('hi')\n")
    (pkg / "_speedups.cpython-312-x86_64-linux-gnu.so").write_bytes(b"\x7fELF\x00\xff")
    (pkg / "tests" / "__init__.py").write_text("")
    (pkg / "tests" / "test_core.py").write_text(TESTS)
    meta = root / "toypkg-1.2.3.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: toypkg\nVersion: 1.2.3\n")
    (meta / "top_level.txt").write_text("toypkg\n")
    return root


def test_discovers_package_modules_with_provenance(site):
    v = _newest()
    srcs, missing = discover_packages(("toypkg", "no_such_pkg"), (v,), Split.TRAIN, 3000,
                                      (str(site),))
    assert missing == ["no_such_pkg"]
    assert sorted(s.module for s in srcs) == ["toypkg", "toypkg.core"]
    core = next(s for s in srcs if s.module == "toypkg.core")
    pkg = core.package
    assert (pkg.name, pkg.version, pkg.label, pkg.python_version) == ("toypkg", "1.2.3",
                                                                      "toypkg==1.2.3", v)
    assert core.origin == "package" and core.version == v
    assert core.module_file == "toypkg/core.py"
    assert core.test_names == ("toypkg.tests.test_core",)
    assert core.test_files == ("toypkg/tests/__init__.py", "toypkg/tests/test_core.py")
    assert core.test_label == "toypkg/tests/"
    files = core.files("BROKEN = True\n")
    assert files["toypkg/core.py"] == "BROKEN = True\n"
    assert files["toypkg/tests/test_core.py"] == TESTS
    assert not any(f.endswith(".so") for f in files)  # compiled extensions are never copied


def test_heldout_packages_only_make_evaluation_tasks(site, monkeypatch):
    v = _newest()
    monkeypatch.setattr(composer_jax.heldout, "HELDOUT_MODULES",
                        composer_jax.heldout.HELDOUT_MODULES | {"toypkg"})
    train, _ = discover_packages(("toypkg",), (v,), Split.TRAIN, 3000, (str(site),))
    evals, _ = discover_packages(("toypkg",), (v,), Split.EVAL, 3000, (str(site),))
    assert train == [] and sorted(s.module for s in evals) == ["toypkg", "toypkg.core"]


def test_search_order_and_test_interpreter(site):
    own = f"{sys.version_info[0]}.{sys.version_info[1]}"
    others = [v for v in find_pythons() if v != own]
    dirs = package_search_dirs((own,), (str(site),))
    assert dirs[0] == (str(site), own)  # package_dirs first, tested with the running version
    if others:  # the running version is not configured: the newest configured one runs the tests
        assert package_search_dirs((others[0],), (str(site),))[0] == (str(site), others[0])


def test_fast_classes_and_addressable_ids():
    passing = frozenset({"t.A.x", "t.A.y", "t.B.x", "t.C.x"})
    times = {"t.A": 0.2, "t.B": 0.1, "t.C": 5.0, "t.D": 0.01}  # D has no passing test
    assert fast_classes(times, passing, 0.5) == (("t.A", "t.B"), frozenset({"t.A.x", "t.A.y", "t.B.x"}))
    assert addressable("pkg.tests.test_a.Cls.test_x", ("pkg.tests.test_a",))
    assert not addressable("pkg.tests.test_a.test_x", ("pkg.tests.test_a",))
    assert not addressable("pkg.tests.test_b.Cls.test_x", ("pkg.tests.test_a",))
    assert addressable("test_bisect.Cls.test_x", ("test_bisect",))


@needs_bwrap
def test_scratch_sync_drops_files_of_other_candidates(cfg):
    """A (mutated) module left by one candidate must not shadow the library for the next one."""
    sx = Scratch(find_pythons()[cfg.python_versions[0]], SandboxBackend.BWRAP, cfg)
    try:
        sx.sync({"fnmatch.py": "BROKEN = 1\n", "test_fnmatch.py": ""})
        sx.sync({"toypkg/core.py": CORE, "toypkg/tests/test_core.py": TESTS})
        assert sorted(p.relative_to(sx.dir).as_posix() for p in sx.dir.rglob("*.py")) == [
            "toypkg/core.py", "toypkg/tests/test_core.py"]
        sx.write({"extra.py": ""})  # write() only adds
        assert (sx.dir / "extra.py").exists() and (sx.dir / "toypkg" / "core.py").exists()
    finally:
        sx.close()


@needs_bwrap
def test_slow_test_file_is_trimmed_to_its_fast_classes(cfg, tmp_path):
    """Like the held-out `statistics`: one slow class must not make the whole module unusable."""
    (tmp_path / "slowmod.py").write_text(CORE)
    fast = "".join(f"    def test_{i}(self):\n        self.assertEqual(slowmod.clamp({i}, 0, 3), "
                   f"{min(i, 3)})\n\n" for i in range(6))
    (tmp_path / "test_slowmod.py").write_text(
        "import time\nimport unittest\n\nimport slowmod\n\n\nclass Fast(unittest.TestCase):\n"
        + fast + "\nclass Slow(unittest.TestCase):\n    def test_sleep(self):\n"
        "        time.sleep(1.0)\n")
    src = ModuleSource(cfg.python_versions[0], "slowmod", str(tmp_path / "slowmod.py"),
                       str(tmp_path / "test_slowmod.py"))
    c = dataclasses.replace(cfg, max_test_file_seconds=0.6)
    sx = Scratch(find_pythons()[c.python_versions[0]], SandboxBackend.BWRAP, c)
    try:
        b = baseline(sx, src, c)
    finally:
        sx.close()
    assert b.usable and b.duration_s > 1.0 and b.test_names == ("test_slowmod.Fast",)
    assert b.passing == frozenset(f"test_slowmod.Fast.test_{i}" for i in range(6))


@needs_bwrap
def test_package_tasks_validate_and_oracle_resolves(site, tmp_path):
    cfg = EnvConfig(num_tasks=3, python_versions=(_newest(),), kinds=("bug", "feature"),
                    stdlib_sources=False, package_sources=("toypkg",), package_dirs=(str(site),),
                    max_tasks_per_module=3, use_embeddings=False)
    summary = generate_pool(cfg, tmp_path / "pool", progress=False)
    assert summary["num_tasks"] == 3 and summary["sources"] == {"toypkg==1.2.3": 3}
    for t in TaskPool(tmp_path / "pool").tasks():
        d = tmp_path / "pool" / "tasks" / t.task_id
        assert (t.origin, t.package, t.package_version) == ("package", "toypkg", "1.2.3")
        assert t.python_version == _newest() and t.split == "train"
        assert t.edit_files == ("toypkg/core.py",) or t.edit_files == ("toypkg/__init__.py",)
        assert t.fail_to_pass and all(x.startswith("toypkg.tests.test_core.") for x in t.test_ids)
        shown = (d / "snapshot" / "toypkg" / "tests" / "test_core.py").read_text()
        graded = d / "grading_tests" / "toypkg" / "tests" / "test_core.py"
        if t.held_back:  # the agent's copy lacks them; the grader runs the package's own file
            assert graded.read_text() == TESTS and shown != TESTS
            assert all(f"def {h.rsplit('.', 1)[1]}(" not in shown for h in t.held_back)
        else:
            assert shown == TESTS and not graded.exists()
        assert not (d / "snapshot" / "toypkg" / "_speedups.cpython-312-x86_64-linux-gnu.so").exists()
        assert "toypkg/" in t.problem_statement
    manifest = json.loads((tmp_path / "pool" / "manifest.json").read_text())
    assert manifest["sources"] == {"toypkg==1.2.3": 3}
    out = check_pool(cfg, tmp_path / "pool", tmp_path / "check", play=run_episode, progress=False)
    assert out["oracle_resolved_rate"] == 1.0 and out["null_resolved_rate"] == 0.0
    assert out["sources"] == {"toypkg==1.2.3": 3}


@needs_bwrap
@pytest.mark.skipif(importlib.util.find_spec("simplejson") is None, reason="simplejson not installed")
def test_simplejson_from_the_environment_makes_tasks(tmp_path):
    """The default package source, found in the running environment (requirements.txt)."""
    cfg = EnvConfig(num_tasks=2, python_versions=(_newest(),), kinds=("bug",),
                    stdlib_sources=False, package_sources=("simplejson",),
                    max_tasks_per_module=1, use_embeddings=False)
    summary = generate_pool(cfg, tmp_path / "pool", progress=False)
    assert summary["num_tasks"] == 2 and summary["packages_missing"] == []
    (source,) = summary["sources"]
    assert source.startswith("simplejson==")
    tasks = TaskPool(tmp_path / "pool").tasks()
    assert all(t.edit_files[0].startswith("simplejson/") and t.origin == "package" for t in tasks)
    out = check_pool(cfg, tmp_path / "pool", tmp_path / "check", play=run_episode, progress=False)
    assert out["oracle_resolved_rate"] == 1.0 and out["null_resolved_rate"] == 0.0
