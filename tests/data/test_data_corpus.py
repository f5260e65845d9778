"""Corpus build: filters, exact + near dedup, held-out modules, manifest, split, cache, bad input."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sysconfig

import pytest
from data_helpers import module_source, write

from composer_jax.data.config import DataConfig
from composer_jax.data.corpus import build_or_load_corpus
from composer_jax.data.errors import DataError
from composer_jax.data.split import SPLITS, split_of
from composer_jax.errors import ConfigError
from composer_jax.heldout import HELDOUT_MODULES


def _cfg(root, cache, **kw) -> DataConfig:
    return DataConfig(cache_dir=str(cache), source_roots=(str(root),), progress=False, **kw)


def _rel(corpus, root) -> dict[str, str]:
    return {os.path.relpath(m["path"], root): m["split"] for m in corpus.manifest()}


def test_filters_dedup_and_heldout(synthetic_root, tmp_path):
    root, expected = synthetic_root
    corpus = build_or_load_corpus(_cfg(root, tmp_path / "cache", validation_fraction=0.0))
    assert sorted(_rel(corpus, root)) == sorted(expected["kept"])
    reasons = {}
    for line in (corpus.directory / "dropped.jsonl").read_text().splitlines():
        row = json.loads(line)
        reasons[os.path.relpath(row["path"], root)] = row
    for reason, paths in expected.items():
        if reason in ("kept", "heldout"):
            continue
        for rel in paths:
            assert reasons[rel]["reason"] == reason, rel
    assert os.path.relpath(reasons["pkg/zz_copy_of_mod_0.py"]["duplicate_of"], root) == "pkg/mod_0.py"
    assert os.path.relpath(reasons["zz/near_mod_1.py"]["duplicate_of"], root) == "pkg/mod_1.py"
    assert corpus.stats["skipped_while_listing"]["heldout"] == len(expected["heldout"])
    assert corpus.stats["dropped_by_reason"]["exact_duplicate"] == 1
    assert corpus.stats["dropped_by_reason"]["near_duplicate"] == 1


def test_heldout_modules_absent_from_real_stdlib_corpus(tmp_path):
    stdlib = sysconfig.get_paths()["stdlib"]
    root = tmp_path / "lib"
    for name in ("textwrap.py", "heapq.py", "colorsys.py", "shlex.py", "keyword.py", "this.py"):
        src = os.path.join(stdlib, name)
        if os.path.isfile(src):
            write(root, name, open(src, encoding="utf-8").read())
    write(root, "test/test_textwrap.py", module_source(3))
    corpus = build_or_load_corpus(_cfg(root, tmp_path / "cache"))
    for m in corpus.manifest():
        stem = m["relpath"].split("/")[-1].removesuffix(".py").removeprefix("test_")
        assert stem not in HELDOUT_MODULES and m["relpath"].split("/")[0] not in HELDOUT_MODULES
    texts = "".join(corpus.iter_texts("train")) + "".join(corpus.iter_texts("validation"))
    assert "def dedent(" not in texts and "def heappush(" not in texts


def test_manifest_provenance_and_texts(synthetic_root, tmp_path):
    root, _ = synthetic_root
    corpus = build_or_load_corpus(_cfg(root, tmp_path / "cache", validation_fraction=0.3))
    for m in corpus.manifest():
        data = open(m["path"], "rb").read()
        assert m["bytes"] == len(data) == os.path.getsize(m["path"])
        assert m["sha256"] == hashlib.sha256(data).hexdigest()
        assert m["source"] == "dir" and m["python"] == ""
        assert corpus.text(m["split"], m["index"]) == data.decode("utf-8")
    assert sum(corpus.num_docs(s) for s in SPLITS) == len(corpus.manifest())


def test_split_is_deterministic_path_hash(synthetic_root, tmp_path):
    root, _ = synthetic_root
    a = build_or_load_corpus(_cfg(root, tmp_path / "c1", validation_fraction=0.5))
    b = build_or_load_corpus(_cfg(root, tmp_path / "c2", validation_fraction=0.5))
    assert _rel(a, root) == _rel(b, root)
    for m in a.manifest():
        assert m["split"] == split_of("dir", m["relpath"], 0.5, "composer_jax")
    keys = [f"pkg/m{i}.py" for i in range(2000)]
    share = sum(split_of("stdlib", k, 0.1, "s") == "validation" for k in keys) / len(keys)
    assert 0.07 < share < 0.13
    # The python version is not part of the key: all versions of a module share a split.
    assert split_of("stdlib", "asyncio/tasks.py", 0.5, "s") == split_of("stdlib", "asyncio/tasks.py", 0.5, "s")


def test_cache_rebuilds_only_on_input_change(synthetic_root, tmp_path):
    root, _ = synthetic_root
    cfg = _cfg(root, tmp_path / "cache")
    first = build_or_load_corpus(cfg)
    again = build_or_load_corpus(cfg)
    assert first.built_now and not again.built_now and again.fingerprint == first.fingerprint
    path = os.path.join(root, "pkg/mod_2.py")
    with open(path, "a") as f:
        f.write("\n# edited\n")
    edited = build_or_load_corpus(cfg)
    assert edited.built_now and edited.fingerprint != first.fingerprint
    write(root, "pkg/new_mod.py", module_source(99))
    added = build_or_load_corpus(cfg)
    assert added.built_now and "pkg/new_mod.py" in _rel(added, root)
    changed = build_or_load_corpus(_cfg(root, tmp_path / "cache", near_dup_threshold=0.95))
    assert changed.built_now and changed.fingerprint != added.fingerprint
    assert not build_or_load_corpus(cfg).built_now


def test_max_files_is_a_deterministic_subset(synthetic_root, tmp_path):
    """The sample depends on paths inside the root only: a copy elsewhere samples the same files."""
    root, expected = synthetic_root
    moved = tmp_path / "elsewhere" / "checkout"
    shutil.copytree(root, moved)
    a = build_or_load_corpus(_cfg(root, tmp_path / "c1", max_files=8))
    b = build_or_load_corpus(_cfg(root, tmp_path / "c2", max_files=8))
    c = build_or_load_corpus(_cfg(moved, tmp_path / "c3", max_files=8))
    assert a.stats["candidates"] == 8 and _rel(a, root)
    assert _rel(a, root) == _rel(b, root) == _rel(c, moved)


def test_bad_inputs(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="no .*py files"):
        build_or_load_corpus(_cfg(empty, tmp_path / "cache"))
    with pytest.raises(ConfigError, match="not a readable directory"):
        build_or_load_corpus(_cfg(tmp_path / "missing", tmp_path / "cache"))
    junk = tmp_path / "junk"
    write(junk, "a.py", "x = 1\n")
    write(junk, "b.py", b"\x00" * 500)
    with pytest.raises(DataError, match="corpus is empty.*too_small"):
        build_or_load_corpus(_cfg(junk, tmp_path / "cache"))


def test_abandoned_builds_are_cleaned_and_ignored(tmp_path):
    from composer_jax.data.cache import build_once

    stale = tmp_path / "kind" / ".tmp-abc-999999999"
    stale.mkdir(parents=True)
    (tmp_path / "kind" / "abc").mkdir()  # an incomplete entry (no COMPLETE marker) must not be trusted
    directory, built = build_once(tmp_path, "kind", "abc", lambda out: (out / "x").write_text("1"))
    assert built and (directory / "x").read_text() == "1" and not stale.exists()

    def fail(out):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        build_once(tmp_path, "kind", "def", fail)
    assert not (tmp_path / "kind" / "def").exists() and not list((tmp_path / "kind").glob(".tmp-def-*"))


def test_auto_discovery_finds_this_interpreter():
    from composer_jax.data.sources import discover_roots

    roots = discover_roots(include_site_packages=True)
    purelib = os.path.realpath(sysconfig.get_paths()["purelib"])
    assert any(os.path.realpath(r.path) == purelib and r.kind == "site-packages" for r in roots)
    assert all(r.kind in ("stdlib", "site-packages") for r in roots)


@pytest.mark.slow
def test_debug_build_from_real_sources_is_fast(tmp_path):
    import time

    from composer_jax.data.loaders import make_train_iterator
    from composer_jax.data.tokenizer import build_or_load_tokenizer

    start = time.time()
    cfg = DataConfig(cache_dir=str(tmp_path), max_files=300, vocab_size=1024, seq_len=128, global_batch_size=8,
                     progress=False)
    corpus = build_or_load_corpus(cfg)
    tok = build_or_load_tokenizer(cfg, corpus, model_vocab_size=1024)
    batch = next(make_train_iterator(cfg, tok, 1, 0, 1, corpus=corpus))
    assert batch["tokens"].shape == (8, 128) and corpus.stats["candidates"] == 300
    assert time.time() - start < 90  # ~15-30 s on 2 cores; generous because CI machines are shared
