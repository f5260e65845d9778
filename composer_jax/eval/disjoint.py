"""Content-level proof that the evaluation suite shares no file with what training sees.

Names are not enough (a held-out module's text could sit in a vendored copy under another name),
so the check is on contents: the sha256 of every file of every suite task (its snapshot: the
module as the agent gets it and the tests; its solution: the reference fix) is compared with the
sha256 of

  corpus    every file the pretraining corpus may contain: the corpus builder's own candidate
            listing (`composer_jax.data.sources`, held-out modules already removed), or the texts of
            a built corpus directory;
  rl_pool   every file of every training task of an RL task pool (snapshot and solution);
  sft       the SFT sources: the task pool its oracle transcripts come from (data.sft_pool) -- SFT
            docstring samples come from the corpus, covered above.

Each comparison is made twice: on exact bytes and on a whitespace-normalised text (trailing
spaces and blank lines dropped), so a reformatted copy is caught too. Files shorter than
`MIN_CHARS` normalised characters (an empty `__init__.py`) are not evidence of anything and are
ignored on both sides.
"""
from __future__ import annotations

import hashlib
import pathlib
from typing import Iterable

import numpy as np

from composer_jax.data import sources
from composer_jax.env.tasks.pool import TaskPool

MIN_CHARS = 64


def normalise(text: str) -> str:
    return "\n".join(ln.rstrip() for ln in text.splitlines() if ln.strip())


def content_hashes(texts: Iterable[str | bytes]) -> set[str]:
    """{"raw:<sha256>", "norm:<sha256>"} of each text of at least MIN_CHARS normalised characters."""
    out = set()
    for t in texts:
        data = t.encode("utf-8") if isinstance(t, str) else t
        norm = normalise(data.decode("utf-8", errors="replace"))
        if len(norm) < MIN_CHARS:
            continue
        out.add("raw:" + hashlib.sha256(data).hexdigest())
        out.add("norm:" + hashlib.sha256(norm.encode("utf-8")).hexdigest())
    return out


def _task_texts(task_dir: pathlib.Path):
    for sub in ("snapshot", "solution"):
        for p in sorted((task_dir / sub).rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                yield p.read_bytes()


def suite_hashes(suite_dir: pathlib.Path) -> dict[str, str]:
    """{hash: "task_id/sub/rel"} over every file of every task of a suite directory."""
    out = {}
    for task_dir in sorted((pathlib.Path(suite_dir) / "tasks").iterdir()):
        for sub in ("snapshot", "solution"):
            for p in sorted((task_dir / sub).rglob("*")):
                if p.is_file() and "__pycache__" not in p.parts:
                    for h in content_hashes([p.read_bytes()]):
                        out[h] = f"{task_dir.name}/{sub}/{p.relative_to(task_dir / sub).as_posix()}"
    return out


def pool_hashes(pool_dir: pathlib.Path, split: str = "train") -> set[str]:
    """Content hashes of every file of the pool's tasks of `split` ("" = every task)."""
    pool = TaskPool(pathlib.Path(pool_dir))
    out = set()
    for t in pool.tasks():
        if not split or t.split == split:
            out |= content_hashes(_task_texts(pool.task_dir(t.task_id)))
    return out


def corpus_candidate_hashes(include_site_packages: bool = True, roots: tuple[str, ...] = ()) -> tuple[set[str], int]:
    """(content hashes, number of files) of every file the corpus builder would consider, after
    its held-out filter (the builder's own listing code)."""
    rts = sources.explicit_roots(roots) if roots else sources.discover_roots(include_site_packages)
    files = sources.list_files(rts).files
    out = set()
    for f in files:
        try:
            out |= content_hashes([pathlib.Path(f.path).read_bytes()])
        except OSError:
            continue
    return out, len(files)


def built_corpus_hashes(corpus_dir: pathlib.Path) -> tuple[set[str], int]:
    """(content hashes, number of documents) of the texts of a built corpus directory."""
    corpus_dir = pathlib.Path(corpus_dir)
    out, n = set(), 0
    for split in ("train", "val", "validation"):
        offs = corpus_dir / f"{split}.offsets.npy"
        if not offs.exists():
            continue
        offsets = np.load(offs)
        data = (corpus_dir / f"{split}.bin").read_bytes()
        for a, b in zip(offsets[:-1], offsets[1:]):
            out |= content_hashes([data[int(a):int(b)]])
            n += 1
    return out, n


def overlap(suite: dict[str, str], other: set[str]) -> list[str]:
    """Suite files (task/sub/rel) whose contents also occur in `other`."""
    return sorted({where for h, where in suite.items() if h in other})


def disjointness_report(suite_dir: pathlib.Path, *, rl_pool: pathlib.Path | None,
                        sft_pool: pathlib.Path | None, corpus_dirs: Iterable[pathlib.Path] = (),
                        corpus_listing: bool = True, include_site_packages: bool = True) -> dict:
    """The overlap of the suite with each training source; `disjoint` is True when all are empty."""
    suite = suite_hashes(suite_dir)
    report = {"suite_files": len(set(suite.values())), "sources": {}}

    def add(name, hashes, n):
        report["sources"][name] = {"files": n, "overlap": overlap(suite, hashes)}

    if corpus_listing:
        h, n = corpus_candidate_hashes(include_site_packages)
        add("corpus_candidates", h, n)
    for d in corpus_dirs:
        h, n = built_corpus_hashes(d)
        add(f"corpus:{pathlib.Path(d).name}", h, n)
    for name, pool in (("rl_pool", rl_pool), ("sft_pool", sft_pool)):
        if pool is not None and pathlib.Path(pool).is_dir():
            add(name, pool_hashes(pool), len(TaskPool(pathlib.Path(pool))))
    report["disjoint"] = all(not v["overlap"] for v in report["sources"].values())
    return report
