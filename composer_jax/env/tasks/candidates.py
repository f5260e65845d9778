"""Candidate tasks of each kind, built from a module source and its baseline (not yet validated).

A `Candidate` carries before/after file contents, the tests that pass on the after files (and the
test names whose full run validates it), its provenance, and a function that writes the problem
statement once validation knows the failing tests.
"""
from __future__ import annotations

import ast
import dataclasses
import difflib
import hashlib
import os
import pathlib
import random
from typing import Callable

from composer_jax.env.tasks import large_feature, mutate, refactor, statements
from composer_jax.env.tasks.sources import ModuleSource, package_texts


@dataclasses.dataclass(frozen=True)
class Baseline:
    """The test outcomes of an unmodified module: `passing` test ids, run time, why unusable, and
    `tests`: the test names a candidate's full run uses (the source's test modules, or the fast
    test classes of a slow test file; empty means the source's test modules)."""
    source: ModuleSource
    passing: frozenset
    duration_s: float
    usable: bool
    reason: str = ""
    tests: tuple = ()

    @property
    def test_names(self) -> tuple:
        return self.tests or self.source.test_names


@dataclasses.dataclass(frozen=True)
class Candidate:
    cid: str
    kind: str
    python_version: str
    module: str
    before: dict
    after: dict
    after_passing: frozenset
    statement: Callable[[tuple, dict], str]
    source_version: str
    test_version: str
    mutations: tuple = ()
    test_names: tuple = ()
    test_files: tuple = ()
    origin: str = "stdlib"
    package: str = ""
    package_version: str = ""


def _digest(*parts: str) -> str:
    return hashlib.sha1("\x00".join(parts).encode()).hexdigest()[:10]


def _make(kind: str, cid_tail: str, base: Baseline, before_text: str, after_text: str,
          statement, mutations: tuple, source_version: str | None = None,
          tests: dict | None = None, extra_passing: frozenset = frozenset()) -> Candidate:
    """A candidate over `base`'s module: `before_text` is what the agent gets, `after_text` the fix.

    `statement(module_file, test_label, f2p, messages)` writes the problem statement. Package
    candidates take the package's version as source and test version. `tests` replaces test files
    (before and after: refactors update the tests), `extra_passing` adds test ids that pass after
    the fix (tests that the update adds)."""
    src = base.source
    pkg = src.package
    label = src.test_label
    before, after = src.files(before_text), src.files(after_text)
    if tests:
        before.update(tests)
        after.update(tests)
    return Candidate(
        cid=f"{kind}-{cid_tail}-{src.module}" if kind == "migration" else
        f"{kind}-{src.version}-{src.module}-{cid_tail}",
        kind=kind, python_version=src.version, module=src.module,
        before=before, after=after,
        after_passing=base.passing | extra_passing,
        source_version=source_version or (pkg.version if pkg else src.version),
        test_version=pkg.version if pkg else src.version,
        statement=lambda f2p, msgs: statement(src.module_file, label, f2p, msgs),
        mutations=mutations, test_names=base.test_names, test_files=src.test_files,
        origin=src.origin, package=pkg.name if pkg else "",
        package_version=pkg.version if pkg else "")


def bug_candidates(base: Baseline, rng: random.Random):
    """Yields single-mutation candidates in random order (lazily syntax-checked)."""
    src = base.source
    text = pathlib.Path(src.module_path).read_text(encoding="utf-8")
    sites = mutate.enumerate_mutations(text)
    rng.shuffle(sites)
    for m in sites:
        if not mutate.is_valid(text, [m]):
            continue
        yield _make("bug", _digest(m.key), base, mutate.apply(text, [m]), text,
                    statements.bug_statement, (m.describe(),)), m


def multi_bug_candidate(base: Baseline, accepted: list, rng: random.Random) -> Candidate | None:
    """Combines 2-3 accepted single mutations in different functions of one module."""
    src = base.source
    text = pathlib.Path(src.module_path).read_text(encoding="utf-8")
    pool = list(accepted)
    rng.shuffle(pool)
    chosen = []
    for m in pool:
        if all(m.function != c.function and not mutate.overlaps(m, c) for c in chosen):
            chosen.append(m)
        if len(chosen) == 3:
            break
    if len(chosen) < 2 or not mutate.is_valid(text, chosen):
        return None
    return _make("multi_bug", _digest(*sorted(c.key for c in chosen)), base,
                 mutate.apply(text, chosen), text, statements.multi_bug_statement,
                 tuple(c.describe() for c in chosen))


def _feature_sites(text: str):
    """(qualname, docstring, first body line, last line, indent) of removable function bodies."""
    tree = ast.parse(text)
    for qual, fn in mutate._functions(tree):
        body = list(fn.body)
        doc = ast.get_docstring(fn)
        if doc is not None:
            body = body[1:]
        if not body or body[0].lineno <= fn.lineno or qual.split(".")[-1].startswith("__") and \
                qual.split(".")[-1] != "__init__":
            continue
        first, last = body[0].lineno, fn.end_lineno
        if not 3 <= last - first + 1 <= 40:
            continue
        yield qual, doc or "", first, last, body[0].col_offset


def feature_candidates(base: Baseline, rng: random.Random):
    src = base.source
    text = pathlib.Path(src.module_path).read_text(encoding="utf-8")
    lines = text.splitlines(True)
    sites = list(_feature_sites(text))
    rng.shuffle(sites)
    for qual, doc, first, last, indent in sites:
        new = "".join(lines[:first - 1]) + " " * indent + "raise NotImplementedError\n" + \
            "".join(lines[last:])
        try:
            ast.parse(new)
        except SyntaxError:
            continue
        yield _make("feature", _digest(qual), base, new, text,
                    lambda mf, tl, f2p, msgs, q=qual, d=doc: statements.feature_statement(mf, q, d, tl),
                    (f"feature_deletion of {qual} (lines {first}-{last})",))


def _test_texts(src: ModuleSource) -> dict[str, str]:
    """The source's test files (workspace path -> text)."""
    if src.package:
        texts = package_texts(src.package)
        return {r: texts[r] for r in src.test_files if r.endswith(".py")}
    return {src.test_files[0]: pathlib.Path(src.test_path).read_text(encoding="utf-8")}


def _dotted(rel: str) -> str:
    parts = rel[:-3].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def refactor_candidates(base: Baseline, rng: random.Random):
    """Yields rename candidates (`refactor.py`) in random order."""
    src = base.source
    text = pathlib.Path(src.module_path).read_text(encoding="utf-8")
    tests = _test_texts(src)
    roots = ((os.path.join(src.package.root, src.package.name),) if src.package
             else (os.path.dirname(src.module_path),))
    external = refactor.external_uses(src.module, roots, frozenset({src.module_path}))
    for site in refactor.rename_sites(text, tests, src.module, rng, external):
        done = refactor.apply_rename(text, tests, src.module, site)
        if done is None:
            continue
        new_text, new_tests, api_file = done
        api = frozenset(f"{_dotted(api_file)}.{refactor.API_TEST_CLASS}.{t}"
                        for t in ("test_new_name_exists", "test_old_name_removed"))
        changed = {r: t for r, t in new_tests.items() if t != tests[r]}
        yield _make("refactor", _digest(site.qualname, site.new), base, text, new_text,
                    lambda mf, tl, f2p, msgs, s=site: statements.refactor_statement(
                        mf, s.kind, s.qualname, s.new_qualname, tl),
                    (f"rename {site.kind} {site.qualname} -> {site.new_qualname}",),
                    tests=changed, extra_passing=api)


def large_feature_candidates(base: Baseline, rng: random.Random, min_lines: int):
    """Yields large-feature candidates (`large_feature.py`) in random order."""
    src = base.source
    text = pathlib.Path(src.module_path).read_text(encoding="utf-8")
    sites = large_feature.large_sites(text, min_lines)
    rng.shuffle(sites)
    for site in sites:
        new = large_feature.apply_stubs(text, site)
        try:
            ast.parse(new)
        except SyntaxError:
            continue
        stubs = tuple((s.qualname, s.doc) for s in site.stubs)
        yield _make("large_feature", _digest(*site.qualnames), base, new, text,
                    lambda mf, tl, f2p, msgs, st=site, sb=stubs:
                    statements.large_feature_statement(mf, st.label, sb, tl),
                    (f"large_feature_deletion of {site.label} ({site.lines} lines)",))


def migration_candidate(old: ModuleSource, new_base: Baseline, max_lines: int) -> Candidate | None:
    """Module from the older version, tests (and interpreter) from the newer one."""
    new = new_base.source
    old_text = pathlib.Path(old.module_path).read_text(encoding="utf-8")
    new_text = pathlib.Path(new.module_path).read_text(encoding="utf-8")
    if old_text == new_text:
        return None
    changed = sum(1 for ln in difflib.unified_diff(old_text.splitlines(), new_text.splitlines(), n=0)
                  if ln[:1] in "+-" and not ln.startswith(("+++", "---")))
    if changed > max_lines:
        return None
    return _make("migration", f"{old.version}to{new.version}", new_base, old_text, new_text,
                 lambda mf, tl, f2p, msgs: statements.migration_statement(mf, old.version,
                                                                          new.version, tl, f2p),
                 (f"migration {old.version} -> {new.version}",), source_version=old.version)
