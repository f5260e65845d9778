"""codebase_search: semantic code search, offline.

Chunks come from Python's `ast` (each function, method and class header with its line range; other
text files in windows of 40 lines). Retrieval is BM25 (`bm25s`) over identifier-split tokens; the
best candidates are re-ranked with all-MiniLM-L6-v2 sentence embeddings
(`composer_jax.env.embedding`) when available: score = 0.5 * bm25 / max_bm25 + 0.5 * cosine.
Embeddings are cached by chunk text, so repeated searches and tasks over the same module are cheap.
"""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import hashlib
import re
import sys
import threading

import numpy as np

from composer_jax.env.embedding import EmbeddingUnavailable, default_model
from composer_jax.env.tools.result import ToolResult, error
from composer_jax.env.tools.search import iter_files, search_root

WINDOW = 40
RERANK_CANDIDATES = 24
_TOKEN_RE = re.compile(r"[A-Za-z]+|\d+")
_CAMEL_RE = re.compile(r"(?<=[a-z])(?=[A-Z])")
_EMB_CACHE: dict[str, np.ndarray] = {}
_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True)
class Chunk:
    path: str
    name: str
    start: int
    end: int
    text: str


def tokenize_code(text: str) -> list[str]:
    """Lower-cased word pieces of identifiers: 'readLine_count' -> ['read', 'line', 'count']."""
    out = []
    for word in _TOKEN_RE.findall(_CAMEL_RE.sub(" ", text)):
        w = word.lower()
        if len(w) > 1:
            out.append(w)
    return out


def python_chunks(path: str, source: str) -> list[Chunk]:
    """One chunk per function/method/class (class chunks hold the header up to the first member)."""
    lines = source.splitlines()
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return window_chunks(path, source)
    chunks = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                start = min([d.lineno for d in child.decorator_list] + [child.lineno])
                end = child.end_lineno or child.lineno
                name = prefix + child.name
                if isinstance(child, ast.ClassDef):
                    body_start = child.body[0].lineno if child.body else end + 1
                    head_end = max(start, body_start - 1 if body_start > child.lineno else end)
                    doc = ast.get_docstring(child) or ""
                    chunks.append(Chunk(path, "class " + name, start, head_end,
                                        "\n".join(lines[start - 1:head_end]) + "\n" + doc))
                    visit(child, name + ".")
                else:
                    chunks.append(Chunk(path, name, start, end, "\n".join(lines[start - 1:end])))
    visit(tree, "")
    if not chunks:
        return window_chunks(path, source)
    return chunks


def window_chunks(path: str, source: str) -> list[Chunk]:
    lines = source.splitlines()
    return [Chunk(path, f"lines {s + 1}-{min(s + WINDOW, len(lines))}", s + 1,
                  min(s + WINDOW, len(lines)), "\n".join(lines[s:s + WINDOW]))
            for s in range(0, max(len(lines), 1), WINDOW)]


def collect_chunks(ws, roots) -> list[Chunk]:
    chunks = []
    for root in roots:
        files = [root] if root.is_file() else list(iter_files(ws.root, root))
        for f in files:
            if f.stat().st_size > 1 << 20:
                continue
            data = f.read_bytes()
            if b"\x00" in data[:4096]:
                continue
            rel = f.relative_to(ws.root).as_posix()
            text = data.decode("utf-8", errors="replace")
            chunks += python_chunks(rel, text) if f.suffix == ".py" else window_chunks(rel, text)
    return chunks


@contextlib.contextmanager
def _jax_hidden():
    """bm25s imports jax if it can (for top-k); hide it so env workers stay JAX-free."""
    had = "jax" in sys.modules
    if not had:
        sys.modules["jax"] = None  # makes `import jax` raise ImportError
    try:
        yield
    finally:
        if not had and sys.modules.get("jax", 0) is None:
            del sys.modules["jax"]


def bm25_scores(chunks: list[Chunk], query: str) -> np.ndarray:
    """BM25 score of every chunk for `query` (bm25s, Lucene variant)."""
    with _jax_hidden():
        import bm25s
    corpus = [tokenize_code(c.name + " " + c.text) or ["_"] for c in chunks]
    q = tokenize_code(query)
    if not q:
        return np.zeros(len(chunks), np.float32)
    retriever = bm25s.BM25()
    retriever.index(corpus, show_progress=False)
    return np.asarray(retriever.get_scores(q), np.float32)


def embed_cached(texts: list[str]) -> np.ndarray:
    keys = [hashlib.sha1(t.encode()).hexdigest() for t in texts]
    with _LOCK:
        todo = [i for i, k in enumerate(keys) if k not in _EMB_CACHE]
        if todo:
            vecs = default_model().encode([texts[i] for i in todo])
            for i, v in zip(todo, vecs):
                _EMB_CACHE[keys[i]] = v
        return np.stack([_EMB_CACHE[k] for k in keys])


def rank(chunks: list[Chunk], query: str, top_k: int, use_embeddings: bool) -> list[tuple[float, Chunk]]:
    """The `top_k` best chunks for `query` with their scores, best first."""
    if not chunks:
        return []
    bm = bm25_scores(chunks, query)
    scores = bm / bm.max() if bm.max() > 0 else bm
    if use_embeddings:
        cand = list(np.argsort(-bm, kind="stable")[:RERANK_CANDIDATES])
        if len(chunks) <= RERANK_CANDIDATES * 2:
            cand = list(range(len(chunks)))
        emb = embed_cached([f"{c.name}\n{c.text[:1500]}" for c in (chunks[i] for i in cand)])
        qv = embed_cached([query])[0]
        mixed = np.full(len(chunks), -1.0, np.float32)
        mixed[cand] = 0.5 * scores[cand] + 0.5 * (emb @ qv)
        scores = mixed
    order = np.argsort(-scores, kind="stable")[:top_k]
    return [(float(scores[i]), chunks[i]) for i in order if scores[i] > 0]


def codebase_search(ws, args: dict) -> ToolResult:
    query = args["query"].strip()
    if not query:
        return error("query is empty")
    roots = search_root(ws, args.get("target_directories"))
    use_emb = ws.config.use_embeddings
    try:
        ranked = rank(collect_chunks(ws, roots), query, ws.config.codebase_search_top_k, use_emb)
    except Exception as exc:  # the embedding package missing: BM25 alone
        if not isinstance(exc, EmbeddingUnavailable):
            raise
        ranked = rank(collect_chunks(ws, roots), query, ws.config.codebase_search_top_k, False)
    if not ranked:
        return ToolResult(f"No code found for {query!r}")
    parts = []
    for score, c in ranked:
        body = "\n".join(c.text.splitlines()[:12])
        parts.append(f"{c.path}:{c.start}-{c.end}  {c.name}  (score {score:.2f})\n{body}")
    return ToolResult("\n\n".join(parts))
