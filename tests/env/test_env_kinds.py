"""The refactor and large_feature task kinds, and env_check's per-kind report, on the shared pool."""
import json
import random

from composer_jax.agent.episode import run_episode
from composer_jax.env.check import check_pool
from composer_jax.env.tasks import large_feature, refactor

from env_helpers import needs_bwrap

MODULE = '''"""Doc."""
__all__ = ["area", "Shape"]


def area(w, h):
    """Area."""
    return w * h


def _helper(x):
    return area(x, x)


class Shape:
    def __init__(self, w, h):
        self.w = w
        self.h = h

    def size(self):
        """Size."""
        total = area(self.w, self.h)
        return total
'''
TESTS = '''import unittest
from mod import area, Shape


class T(unittest.TestCase):
    def test_area(self):
        self.assertEqual(area(2, 3), 6)

    def test_size(self):
        self.assertEqual(Shape(2, 2).size(), 4)
'''


def test_rename_is_token_exact_and_updates_all_and_tests():
    sites = {s.qualname: s for s in refactor.rename_sites(MODULE, {"test_mod.py": TESTS}, "mod",
                                                        random.Random(0))}
    assert set(sites) == {"area", "Shape", "Shape.size"}
    site = sites["area"]
    new_mod, tests, api_file = refactor.apply_rename(MODULE, {"test_mod.py": TESTS}, "mod", site)
    assert api_file == "test_mod.py"
    assert f'"{site.new}"' in new_mod and f"def {site.new}(w, h)" in new_mod
    assert new_mod.count(site.new) == 4 and "area(" not in new_mod.replace(site.new + "(", "")
    assert "Area." in new_mod  # docstrings and comments untouched
    assert f"from mod import {site.new}, Shape" in tests["test_mod.py"]
    assert refactor.API_TEST_CLASS in tests["test_mod.py"]
    compile(tests["test_mod.py"], "t", "exec")


def test_names_other_code_reaches_are_never_renamed(tmp_path):
    """A rename the rest of the installation depends on is refused: an alias attribute use, a
    `from` import and a method called on an instance each block their site; test directories do
    not count."""
    (tmp_path / "mod.py").write_text(MODULE)
    (tmp_path / "user.py").write_text("import mod as m\n\nprint(m.area(1, 2))\n")
    (tmp_path / "other.py").write_text("from mod import (\n    Shape,\n)\n\nShape(1, 1).size()\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "t.py").write_text("import mod\nmod.volume()\n")
    ext = refactor.external_uses("mod", (str(tmp_path),), frozenset({str(tmp_path / "mod.py")}))
    assert ext.names == {"area", "Shape"} and "size" in ext.attributes and "volume" not in ext.names
    kept = refactor.rename_sites(MODULE, {"test_mod.py": TESTS}, "mod", random.Random(0), ext)
    assert kept == []
    only_user = refactor.external_uses("mod", (str(tmp_path),),
                                       frozenset({str(tmp_path / "mod.py"), str(tmp_path / "other.py")}))
    kept = refactor.rename_sites(MODULE, {"test_mod.py": TESTS}, "mod", random.Random(0), only_user)
    assert sorted(s.qualname for s in kept) == ["Shape", "Shape.size"]


def test_stdlib_rename_that_breaks_the_interpreter_is_refused():
    """The running interpreter's traceback module calls textwrap.indent (3.11-3.13): a task renaming
    it left the grader's interpreter unable to format an error (the reference fix scored 0/68)."""
    import sysconfig
    stdlib = sysconfig.get_paths()["stdlib"]
    path = f"{stdlib}/textwrap.py"
    ext = refactor.external_uses("textwrap", (stdlib,), frozenset({path}))
    assert {"indent", "dedent", "wrap", "fill", "TextWrapper"} <= ext.names
    text = open(path, encoding="utf-8").read()
    tests = {"test_textwrap.py": "import unittest\nfrom textwrap import indent, dedent, shorten\n"}
    before = {s.qualname for s in refactor.rename_sites(text, tests, "textwrap", random.Random(0))}
    after = {s.qualname for s in refactor.rename_sites(text, tests, "textwrap", random.Random(0), ext)}
    assert {"indent", "dedent"} <= before and after == {"shorten"}


def test_large_sites_cover_classes_and_function_groups():
    text = "def a():\n" + "    x = 1\n" * 30 + "\n\ndef b():\n    '''B.'''\n" + "    y = 2\n" * 30 + \
        "\n\nclass C:\n    def m(self):\n" + "        z = 3\n" * 40 + \
        "\n    def n(self):\n" + "        return 1\n" * 20
    sites = large_feature.large_sites(text, 50)
    labels = sorted(s.label for s in sites)
    assert labels == ["class `C`", "the functions `a` and `b`"]
    group = next(s for s in sites if s.class_name == "")
    assert group.lines == 60
    stubbed = large_feature.apply_stubs(text, group)
    assert stubbed.count("raise NotImplementedError") == 2 and "'''B.'''" in stubbed
    compile(stubbed, "t", "exec")


@needs_bwrap
def test_new_kinds_generate_validate_and_check(mini_pool, tmp_path):
    pool, cfg = mini_pool
    tasks = pool.tasks()
    ref = next(t for t in tasks if t.kind == "refactor")
    d = pool.task_dir(ref.task_id)
    (rel,) = ref.edit_files
    (test_rel,) = ref.test_files
    snap_tests = (d / "snapshot" / test_rel).read_text()
    assert refactor.API_TEST_CLASS in snap_tests
    assert any(refactor.API_TEST_CLASS in t for t in ref.fail_to_pass)
    assert "rename" in ref.problem_statement and ref.lines_changed >= 2
    big = next(t for t in tasks if t.kind == "large_feature")
    assert big.lines_changed >= 50
    text = (pool.task_dir(big.task_id) / "snapshot" / big.edit_files[0]).read_text()
    assert text.count("raise NotImplementedError") >= 2
    manifest = json.loads((pool.root / "manifest.json").read_text())
    assert manifest["median_lines_changed"]["large_feature"] >= 50
    assert {t["kind"] for t in manifest["tasks"]} == {"bug", "refactor", "large_feature"}
    out = check_pool(cfg, pool.root, tmp_path / "check", play=run_episode, progress=False)
    assert out["oracle_resolved_rate"] == 1.0 and out["null_resolved_rate"] == 0.0
    assert out["oracle_tampered"] == 0 and out["null_tampered"] == 0
    assert set(out["per_kind"]) == {"bug", "refactor", "large_feature"}
    for kind, row in out["per_kind"].items():
        assert row["count"] == sum(t.kind == kind for t in tasks)
        assert row["median_lines_changed"] == out["median_lines_changed"][kind] >= 1
    assert json.loads((tmp_path / "check" / "env_check.json").read_text())["per_kind"]
