"""The local code corpus: built once from the machine's Python sources into the cache, then loaded.

Build steps (`build_or_load_corpus`):
  1. list candidate files (`sources`), held-out modules removed; `max_files` > 0 keeps a
     deterministic subset (smallest sha256 of the path);
  2. fingerprint = hash(builder settings, held-out list, every candidate's path/size/mtime): the
     cache key, so the corpus is rebuilt exactly when an input or a setting changes;
  3. read + sha256 + content filters (`filters`), in priority order: stdlib before site-packages,
     newer Python versions first; the first copy of each content hash is kept (exact dedup);
  4. Python-3 parse check (Python 2.7's stdlib is scanned too: only its files that still parse as
     Python 3 survive, as reason "syntax" documents) and MinHash near-dedup (`minhash`);
  5. deterministic train/validation split by path hash (`split`);
  6. write, per split, `<split>.bin` (UTF-8 texts back to back) and `<split>.offsets.npy`
     (`[N+1] int64` byte offsets), `manifest.jsonl` (one line per kept file: split, index, path,
     source kind, python version, relpath, bytes, sha256), `dropped.jsonl` (path, reason,
     duplicate_of) and `stats.json`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from composer_jax.data import corpus_scan, filters, minhash, sources, split
from composer_jax.data.cache import build_once, stable_hash
from composer_jax.data.config import DataConfig, resolved_cache_dir
from composer_jax.data.errors import DataError
from composer_jax.heldout import HELDOUT_MODULES

BUILDER_VERSION = 1
_KIND_PRIORITY = {"stdlib": 0, "site-packages": 1, "dir": 2}


@dataclasses.dataclass(frozen=True)
class Corpus:
    """A built corpus in `directory`. `built_now` is True if this call built it (False: cache hit)."""

    directory: Path
    fingerprint: str
    stats: dict
    built_now: bool

    def num_docs(self, split_name: str) -> int:
        return len(self._offsets(split_name)) - 1

    def text(self, split_name: str, index: int) -> str:
        offsets = self._offsets(split_name)
        with open(self.directory / f"{split_name}.bin", "rb") as f:
            f.seek(int(offsets[index]))
            return f.read(int(offsets[index + 1] - offsets[index])).decode("utf-8")

    def iter_texts(self, split_name: str) -> Iterator[str]:
        """The texts of a split in manifest order."""
        offsets = self._offsets(split_name)
        with open(self.directory / f"{split_name}.bin", "rb") as f:
            for start, end in zip(offsets[:-1], offsets[1:]):
                yield f.read(int(end - start)).decode("utf-8")

    def manifest(self) -> list[dict]:
        with open(self.directory / "manifest.jsonl", encoding="utf-8") as f:
            return [json.loads(line) for line in f]

    def _offsets(self, split_name: str) -> np.ndarray:
        if split_name not in split.SPLITS:
            raise ValueError(f"unknown split {split_name!r}; valid: {split.SPLITS}")
        return np.load(self.directory / f"{split_name}.offsets.npy")


def build_or_load_corpus(cfg: DataConfig) -> Corpus:
    """The corpus for `cfg`, from the cache when its inputs and settings are unchanged."""
    roots = sources.explicit_roots(cfg.source_roots) if cfg.source_roots else \
        sources.discover_roots(cfg.include_site_packages)
    if not roots:
        raise DataError("no Python source roots found: set data.source_roots to directories of .py files")
    listing = sources.list_files(roots)
    files = listing.files
    if cfg.max_files and len(files) > cfg.max_files:
        chosen = sorted(files, key=_sample_key)[:cfg.max_files]
        keep = {f.path for f in chosen}
        files = [f for f in files if f.path in keep]
    if not files:
        raise DataError(f"no (non-held-out) .py files under the source roots {[r.path for r in roots]}")
    settings = _builder_settings(cfg)
    fingerprint = stable_hash({"settings": settings, "heldout": sorted(HELDOUT_MODULES),
                               "files": [(f.path, f.size, f.mtime_ns) for f in files]})
    directory, built_now = build_once(resolved_cache_dir(cfg), "corpus", fingerprint,
                                      lambda tmp: _build(cfg, files, listing.skipped, tmp))
    stats = json.loads((directory / "stats.json").read_text())
    return Corpus(directory, fingerprint, stats, built_now)


def _sample_key(f: sources.SourceFile) -> bytes:
    """Order for the `max_files` sample: a hash of where the file sits inside its root, never of the
    absolute path, so two checkouts (or venvs) of the same packages sample the same files."""
    return hashlib.sha256(f"{f.root.kind}/{f.root.python}/{f.relpath}".encode()).digest()


def _builder_settings(cfg: DataConfig) -> dict:
    names = ("min_file_bytes", "max_file_bytes", "max_line_length", "max_mean_line_length",
             "min_alnum_fraction", "require_py3_syntax", "near_dup_threshold", "minhash_perms",
             "minhash_bands", "shingle_size", "validation_fraction", "split_salt", "max_files")
    return {"version": BUILDER_VERSION, **{n: getattr(cfg, n) for n in names}}


def _priority(f: sources.SourceFile) -> tuple:
    version = tuple(-int(p) for p in re.findall(r"\d+", f.root.python))  # newest first
    return (_KIND_PRIORITY.get(f.root.kind, 3), version, f.root.path, f.relpath)


def _build(cfg: DataConfig, files: list[sources.SourceFile], skipped: dict, out: Path) -> None:
    start = time.time()
    files = sorted(files, key=_priority)
    settings = filters.FilterSettings(cfg.min_file_bytes, cfg.max_file_bytes, cfg.max_line_length,
                                      cfg.max_mean_line_length, cfg.min_alnum_fraction)
    scanned = corpus_scan.parallel_map(corpus_scan.scan_file, [(f.path, settings) for f in files],
                                       cfg.build_workers, "corpus: read+filter", cfg.progress)
    dropped: list[dict] = []
    first_by_hash: dict[str, int] = {}
    unique: list[int] = []
    for i, (digest, reason) in enumerate(scanned):
        if reason is None and digest in first_by_hash:
            reason = "exact_duplicate"
            dropped.append({"path": files[i].path, "reason": reason,
                            "duplicate_of": files[first_by_hash[digest]].path})
        elif reason is not None:
            dropped.append({"path": files[i].path, "reason": reason})
        else:
            first_by_hash[digest] = i
            unique.append(i)
    signatures = corpus_scan.parallel_map(
        corpus_scan.analyze_file,
        [(files[i].path, cfg.require_py3_syntax, cfg.shingle_size, cfg.minhash_perms) for i in unique],
        cfg.build_workers, "corpus: parse+minhash", cfg.progress)
    parsed = [i for i, sig in zip(unique, signatures) if sig is not None]
    dropped += [{"path": files[i].path, "reason": "syntax"} for i, sig in zip(unique, signatures) if sig is None]
    sig_matrix = np.stack([s for s in signatures if s is not None]) if parsed else \
        np.zeros((0, cfg.minhash_perms), np.uint32)
    dup_of = minhash.near_duplicates(sig_matrix, cfg.minhash_bands, cfg.near_dup_threshold)
    kept = [i for i, d in zip(parsed, dup_of) if d < 0]
    dropped += [{"path": files[i].path, "reason": "near_duplicate", "duplicate_of": files[parsed[d]].path}
                for i, d in zip(parsed, dup_of) if d >= 0]
    if not kept:
        raise DataError(f"the corpus is empty: all {len(files)} candidate files were filtered out "
                        f"(reasons: {dict(Counter(d['reason'] for d in dropped))})")
    manifest = _write_splits(cfg, files, kept, scanned, out)
    _write_jsonl(out / "manifest.jsonl", manifest)
    _write_jsonl(out / "dropped.jsonl", dropped)
    stats = _stats(files, manifest, dropped, skipped, time.time() - start)
    (out / "stats.json").write_text(json.dumps(stats, indent=1, sort_keys=True))


def _write_splits(cfg: DataConfig, files: list[sources.SourceFile], kept: list[int],
                  scanned: list[tuple[str, str | None]], out: Path) -> list[dict]:
    manifest: list[dict] = []
    handles = {s: open(out / f"{s}.bin", "wb") for s in split.SPLITS}
    offsets: dict[str, list[int]] = {s: [0] for s in split.SPLITS}
    try:
        for i in sorted(kept, key=lambda i: (files[i].root.path, files[i].relpath)):
            f = files[i]
            name = split.split_of(f.root.kind, f.relpath, cfg.validation_fraction, cfg.split_salt)
            data = Path(f.path).read_bytes()
            handles[name].write(data)
            offsets[name].append(offsets[name][-1] + len(data))
            manifest.append({"split": name, "index": len(offsets[name]) - 2, "path": f.path,
                             "source": f.root.kind, "python": f.root.python, "relpath": f.relpath,
                             "bytes": len(data), "sha256": scanned[i][0]})
    finally:
        for h in handles.values():
            h.close()
    for name in split.SPLITS:
        np.save(out / f"{name}.offsets.npy", np.asarray(offsets[name], dtype=np.int64))
    return manifest


def _stats(files: list[sources.SourceFile], manifest: list[dict], dropped: list[dict], skipped: dict,
           seconds: float) -> dict:
    def source_key(kind: str, python: str) -> str:
        return f"{kind}:{python}" if python else kind

    return {
        "candidates": len(files),
        "candidates_by_source": dict(Counter(source_key(f.root.kind, f.root.python) for f in files)),
        "kept_by_source": dict(Counter(source_key(m["source"], m["python"]) for m in manifest)),
        "dropped_by_reason": dict(Counter(d["reason"] for d in dropped)),
        "skipped_while_listing": skipped,
        "docs": dict(Counter(m["split"] for m in manifest)),
        "bytes": {s: sum(m["bytes"] for m in manifest if m["split"] == s) for s in split.SPLITS},
        "build_seconds": round(seconds, 2),
    }


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, sort_keys=True) + "\n")
