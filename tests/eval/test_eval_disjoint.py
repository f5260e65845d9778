"""The suite shares no file contents with the pretraining corpus, the RL pool or the SFT pool.

Fast CI checks: the checker finds planted copies (exact and reformatted); the raw material of every
evaluation task -- each installed CPython's held-out module files and their test files, which bug,
feature, refactor and migration tasks are made of -- does not occur in the corpus builder's
candidate files (its own listing, held-out filter applied) nor in a training task pool; and when a
built suite, corpus and pools exist in the cache, their contents are checked too.
"""
import json
import os
import pathlib

import pytest

from composer_jax.eval.disjoint import (built_corpus_hashes, content_hashes, corpus_candidate_hashes,
                                        disjointness_report, overlap, pool_hashes, suite_hashes)
from composer_jax.heldout import HELDOUT_MODULES
from eval_helpers import BUGGY, FIXED, TESTS, make_pool, make_task

CACHE = pathlib.Path(os.environ.get("COMPOSER_JAX_CACHE", pathlib.Path.home() / ".cache/composer_jax"))


def _heldout_material() -> dict[str, str]:
    """{hash: path} of every held-out module file and test file of every installed CPython."""
    from composer_jax.env.pythons import find_pythons
    out = {}
    for py in find_pythons().values():
        lib = pathlib.Path(py.stdlib)
        for name in HELDOUT_MODULES:
            pkg = sorted((lib / name).rglob("*.py")) if (lib / name).is_dir() else []
            for p in [lib / f"{name}.py", lib / "test" / f"test_{name}.py", *pkg]:
                if p.is_file():
                    for h in content_hashes([p.read_bytes()]):
                        out[h] = str(p)
    return out


def test_checker_finds_planted_copies(tmp_path):
    make_pool(tmp_path / "pool", [make_task()])
    from composer_jax.eval.suite import build_suite
    build_suite(tmp_path / "pool", tmp_path / "suite", name="t", size=1, min_median_lines=1)
    suite = suite_hashes(tmp_path / "suite")
    assert len(set(suite.values())) == 3
    clean = content_hashes([FIXED.replace("limit", "bound"), "x = 1\n" * 40])
    assert overlap(suite, clean) == []
    reformatted = "\n\n".join(line + "   " for line in FIXED.splitlines())
    assert overlap(suite, content_hashes([reformatted])) == [
        "bug-3.12-mini-000/solution/colorsys.py"]
    assert overlap(suite, content_hashes([TESTS.encode()])) == [
        "bug-3.12-mini-000/snapshot/test_colorsys.py"]
    # a training pool holding the same test file (under another task) is caught by contents
    t, before, after = make_task("bug-3.12-other-001", split="train")
    make_pool(tmp_path / "train", [(t, {"other.py": BUGGY, "test_other.py": TESTS}, {"other.py": FIXED})])
    report = disjointness_report(tmp_path / "suite", rl_pool=tmp_path / "train", sft_pool=None,
                                 corpus_listing=False)
    assert not report["disjoint"]
    assert "bug-3.12-mini-000/snapshot/test_colorsys.py" in report["sources"]["rl_pool"]["overlap"]


def test_heldout_material_is_not_in_the_corpus_candidates():
    material = _heldout_material()
    assert len(set(material.values())) >= 2 * len(HELDOUT_MODULES)   # every module, >= 1 Python
    corpus, n = corpus_candidate_hashes(include_site_packages=True)
    assert n > 1000
    assert sorted({material[h] for h in material if h in corpus}) == []


def test_cached_suite_is_disjoint_from_cached_corpora_and_pools():
    suites = sorted((CACHE / "eval_suite").glob("*/manifest.json"))
    if not suites:
        pytest.skip(f"no built suite under {CACHE}/eval_suite (run eval_build_suite)")
    material = _heldout_material()
    corpora = [d for d in (CACHE / "corpus").glob("*") if (d / "train.offsets.npy").exists()]
    pools = [p.parent for p in CACHE.glob("**/pool/manifest.json")]
    for manifest in suites:
        suite = suite_hashes(manifest.parent)
        for d in corpora:
            assert overlap(suite, built_corpus_hashes(d)[0]) == [], d
        for p in pools:
            assert overlap(suite, pool_hashes(p)) == [], p
        # the reference fix of a bug/feature/migration task is a held-out file of some CPython
        # (a refactor's fix is a renamed copy, so it is not one)
        sol = [h for h, w in suite.items() if "/solution/" in w and h.startswith("raw:")
               and not w.startswith("refactor")]
        assert sol and all(h in material for h in sol)
        assert json.loads(manifest.read_text())["suite_id"]
