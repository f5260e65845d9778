"""Text search tools: grep_search (regex over contents) and file_search (glob or fuzzy file names)."""
from __future__ import annotations

import fnmatch
import os
import pathlib
import re
from typing import Iterator

from composer_jax.env.paths import resolve
from composer_jax.env.tools.result import ToolResult, error

SKIP_DIRS = {"__pycache__", ".git", ".hg", ".mypy_cache", ".pytest_cache", "node_modules"}
MAX_GREP_FILE = 2 << 20


def iter_files(root: pathlib.Path, start: pathlib.Path | None = None) -> Iterator[pathlib.Path]:
    """Regular files under `start` (default root), sorted, skipping caches and symlinks."""
    for dirpath, dirnames, filenames in os.walk(start or root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            p = pathlib.Path(dirpath, name)
            if not p.is_symlink() and p.is_file():
                yield p


def grep_search(ws, args: dict) -> ToolResult:
    flags = 0 if args.get("case_sensitive", True) else re.IGNORECASE
    try:
        rx = re.compile(args["query"], flags)
    except re.error as exc:
        return error(f"invalid regular expression {args['query']!r}: {exc}")
    include = args.get("include_pattern")
    cap = ws.config.grep_max_hits
    hits: list[str] = []
    total = 0
    for path in iter_files(ws.root):
        rel = path.relative_to(ws.root).as_posix()
        if include and not (fnmatch.fnmatch(rel, include) or fnmatch.fnmatch(path.name, include)):
            continue
        if path.stat().st_size > MAX_GREP_FILE:
            continue
        data = path.read_bytes()
        if b"\x00" in data[:4096]:
            continue
        for i, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            if rx.search(line):
                total += 1
                if len(hits) < cap:
                    hits.append(f"{rel}:{i}: {line[:200]}")
    if not hits:
        return ToolResult(f"No matches for {args['query']!r}")
    more = f"\n... {total - cap} more matches (capped at {cap})" if total > cap else ""
    return ToolResult("\n".join(hits) + more)


def _fuzzy_score(query: str, name: str) -> float | None:
    """Subsequence match score of `query` in `name` (higher is better), None if no match."""
    q, n = query.lower(), name.lower()
    if q in n:
        return 100.0 - (len(n) - len(q)) * 0.1
    pos, score, last = 0, 0.0, -2
    for ch in q:
        idx = n.find(ch, pos)
        if idx < 0:
            return None
        score += 2.0 if idx == last + 1 else 1.0
        last, pos = idx, idx + 1
    return score - len(n) * 0.01


def file_search(ws, args: dict) -> ToolResult:
    query = args["query"].strip()
    if not query:
        return error("query is empty")
    cap = ws.config.search_max_results
    rels = [p.relative_to(ws.root).as_posix() for p in iter_files(ws.root)]
    if any(ch in query for ch in "*?["):
        pat = query[len("/workspace/"):] if query.startswith("/workspace/") else query
        found = [r for r in rels if fnmatch.fnmatch(r, pat) or fnmatch.fnmatch(r.rsplit("/", 1)[-1], pat)
                 or (pat.startswith("**/") and fnmatch.fnmatch(r, pat[3:]))]
    else:
        scored = [(s, r) for r in rels if (s := _fuzzy_score(query, r)) is not None]
        found = [r for _, r in sorted(scored, key=lambda t: (-t[0], t[1]))]
    if not found:
        return ToolResult(f"No files match {query!r}")
    more = f"\n... {len(found) - cap} more" if len(found) > cap else ""
    return ToolResult("\n".join(found[:cap]) + more)


def search_root(ws, directories: list[str] | None) -> list[pathlib.Path]:
    """Resolved directories to search (the whole workspace by default)."""
    return [resolve(ws.root, d) for d in directories] if directories else [ws.root]
