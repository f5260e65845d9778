"""The difficulty ladder's sites, level check and module split (no sandbox: fast)."""
from __future__ import annotations

import ast
import random
import re
import subprocess
import sys
import traceback

import pytest

from composer_jax.config.rl import LadderKeywords
from composer_jax.env.pythons import find_pythons
from composer_jax.env.tasks import ladder_sites, mutate
from composer_jax.env.tasks.ladder_check import check_output, frame_pattern
from composer_jax.env.tasks.ladder_generate import LadderSpec, task_level
from composer_jax.env.tasks.ladder_split import hash_fraction, is_heldout, split_of
from composer_jax.heldout import HELDOUT_MODULES

SOURCE = '''\
import os


class Box:
    def __init__(self, value):
        self.value = value

    def double(self):
        return self.value * 2


def helper(number, scale=1):
    return number * scale


def total(items, factor):
    result = 0
    for item in items:
        result += helper(item, scale=factor)
    return result + len(items)
'''


def _run(source: str, call: str) -> str:
    """The formatted exception of running `call` against `source` (this interpreter)."""
    scope: dict = {}
    exec(compile(source, "/w/mod.py", "exec"), scope)
    try:
        eval(call, scope)
    except Exception as e:  # noqa: BLE001 - the test reads the traceback text
        return "".join(traceback.format_exception(e))
    return ""


def test_level1_sites_make_the_named_error_with_cpythons_own_hint():
    sites = list(ladder_sites.sites(SOURCE, 1, "3.12", random.Random(0)))
    kinds = {s.kind for s in sites}
    assert kinds == {"name", "attribute", "keyword"}
    taken = ladder_sites.identifiers(ast.parse(SOURCE))
    for s in sites:
        assert s.typo not in taken and s.typo != s.original
        assert SOURCE[s.mutation.start:s.mutation.end] == s.original
    if sys.version_info < (3, 12):
        pytest.skip("the hint is checked with a 3.12+ interpreter")
    by_kind = {s.kind: s for s in sites if s.mutation.function in ("total", "Box.double")}
    calls = {"name": "total([1, 2], 3)", "attribute": "Box(2).double()",
             "keyword": "total([1, 2], 3)"}
    for kind, site in by_kind.items():
        broken = mutate.apply(SOURCE, [site.mutation])
        out = _run(broken, calls[kind])
        assert re.search(site.expect, out), (kind, site, out)
        assert re.search(frame_pattern("mod.py", site.mutation.line), out)
        assert _run(SOURCE, calls[kind]) == ""


def test_without_hints_only_keyword_sites_and_level2_sites_are_single_line_operators():
    assert {s.kind for s in ladder_sites.sites(SOURCE, 1, "3.11", random.Random(0))} == {"keyword"}
    level2 = list(ladder_sites.sites(SOURCE, 2, "3.12", random.Random(0)))
    assert level2 and {s.kind for s in level2} <= set(ladder_sites.LEVEL2_OPERATORS)
    assert all("\n" not in SOURCE[s.mutation.start:s.mutation.end] for s in level2)
    with pytest.raises(ValueError):
        ladder_sites.raw_sites(SOURCE, 3, "3.12", random.Random(0))


def _run_with(python: str, source: str, call: str, tmp_path) -> str:
    """`_run` under another CPython (a subprocess): the traceback text that interpreter prints."""
    (tmp_path / "mod.py").write_text(source)
    script = f"import traceback, mod\ntry:\n    mod.{call}\nexcept Exception as e:\n" \
             f"    print(''.join(traceback.format_exception(e)))"
    return subprocess.run([python, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60).stdout


def test_hinted_keyword_sites_exist_only_where_cpython_prints_the_keyword_hint(tmp_path):
    def kinds(version, keywords):
        return {s.kind for s in ladder_sites.sites(SOURCE, 1, version, random.Random(0), keywords)}

    assert kinds("3.11", LadderKeywords.HINTED) == set()               # no hint of any kind
    assert kinds("3.12", LadderKeywords.HINTED) == {"name", "attribute"}
    assert kinds("3.13", LadderKeywords.HINTED) == {"name", "attribute", "keyword"}
    assert kinds("3.11", LadderKeywords.ANY) == {"keyword"}
    site = next(s for s in ladder_sites.sites(SOURCE, 1, "3.13", random.Random(0), LadderKeywords.HINTED)
                if s.kind == "keyword")
    assert "Did you mean '" + site.original in site.expect.replace("\\", "")
    broken = mutate.apply(SOURCE, [site.mutation])
    pythons = find_pythons()
    if "3.13" not in pythons:
        pytest.skip("CPython 3.13 is not installed (pyenv)")
    out = _run_with(pythons["3.13"].executable, broken, "total([1, 2], 3)", tmp_path)
    assert re.search(site.expect, out), out                            # 3.13 prints the hint
    older = [v for v in ("3.12", "3.11") if v in pythons]
    for v in older:                  # the hinted expectation fails on older CPythons: the check would reject
        out = _run_with(pythons[v].executable, broken, "total([1, 2], 3)", tmp_path)
        assert re.search(rf"TypeError: .*'{site.typo}'", out) and not re.search(site.expect, out)


def test_typos_are_one_edit_and_deterministic():
    a = ladder_sites.typos("length", random.Random(1))
    assert a == ladder_sites.typos("length", random.Random(1))
    assert "lenght" in a and "lngth" in a and "length" not in a
    assert all(t[0] == "l" for t in a)                                  # the first letter stays
    assert all(abs(len(t) - len("length")) <= 1 for t in a)


def _site(kind, line=12):
    m = mutate.Mutation(f"{kind}_typo", 0, 1, "x", line, "f")
    return ladder_sites.LadderSite(m, 1, kind, "value", "valeu",
                                   r"AttributeError: .*has no attribute 'valeu'\. Did you mean: "
                                   r"'value'\?")


def test_check_output_level1_needs_the_hint_the_frame_and_only_that_error():
    out = ('  File "/workspace/pkg/mod.py", line 12, in f\n'
           "AttributeError: 'Box' object has no attribute 'valeu'. Did you mean: 'value'?\n")
    msgs = {"t.T.a": "AttributeError: 'Box' object has no attribute 'valeu'"}
    assert check_output(_site("attribute"), "pkg/mod.py", out, msgs) == ""
    assert "lacks" in check_output(_site("attribute"), "pkg/mod.py",
                                   out.replace(" Did you mean: 'value'?", ""), msgs)
    assert "no traceback frame" in check_output(_site("attribute", 13), "pkg/mod.py", out, msgs)
    assert "not AttributeError" in check_output(_site("attribute"), "pkg/mod.py", out,
                                                {**msgs, "t.T.b": "AssertionError: 1 != 2"})


def test_check_output_level2_refuses_a_named_line():
    site = ladder_sites.LadderSite(mutate.Mutation("binop_swap", 0, 1, "-", 7, "f"), 2,
                                   "binop_swap")
    named = 'Traceback:\n  File "/w/mod.py", line 7, in f\nIndexError: list index out of range\n'
    assert "names mod.py line 7" in check_output(site, "mod.py", named, {})
    assert check_output(site, "mod.py", "AssertionError: 3 != 4\n", {}) == ""
    assert check_output(site, "mod.py", named.replace("line 7", "line 70"), {}) == ""


def test_split_is_by_top_level_module_deterministic_and_keeps_heldout_py_out():
    for m in HELDOUT_MODULES:
        assert is_heldout(m, 0, 0.0) and split_of(m, 5, 0.0) == "eval"
    names = [f"mod{i}" for i in range(2000)]
    held = [n for n in names if is_heldout(n, 0, 0.2)]
    assert 300 < len(held) < 500                                   # about the fraction
    assert held == [n for n in names if is_heldout(n, 0, 0.2)]     # deterministic
    assert held != [n for n in names if is_heldout(n, 1, 0.2)]     # the seed moves it
    assert split_of("pkg.a", 3, 0.5) == split_of("pkg.b.c", 3, 0.5) == \
        ("eval" if hash_fraction(3, "pkg") < 0.5 else "train")
    assert not any(is_heldout(n, 0, 0.0) for n in names)


def test_levels_of_kinds_and_spec_validation():
    assert (task_level("level1"), task_level("level2"), task_level("bug")) == (1, 2, 3)
    with pytest.raises(ValueError):
        LadderSpec(levels=(3,))
    with pytest.raises(ValueError):
        LadderSpec(fraction=1.0)
