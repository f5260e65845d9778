"""SFT samples from the corpus: docstring -> function pairs, chat-formatted.

For every function or method in the train split that has a docstring of at least
`sft_min_docstring_chars`, a body beyond the docstring, and at most `sft_max_function_lines` lines,
the user asks for the function by signature and docstring and the assistant answers with its source
(decorators included, dedented). Samples are deduplicated by answer text and kept in corpus order;
`sft_max_samples` > 0 keeps the first ones. Tokenized samples are cached like the token shards
(`<cache>/sft/<key>/`, one store "sft" with a trainable mask).
"""

from __future__ import annotations

import ast
import hashlib
import json
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path

from composer_jax.data import chat, corpus_scan, shards
from composer_jax.data.cache import build_once, stable_hash
from composer_jax.data.config import DataConfig, resolved_cache_dir
from composer_jax.data.errors import DataError

SYSTEM_PROMPT = "You are a careful Python programmer. Answer with the requested code only."


def function_samples(source: str, min_doc_chars: int, max_lines: int) -> Iterator[dict[str, str]]:
    """`{"name", "signature", "docstring", "code"}` for each qualifying function in `source`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError, RecursionError):
            return
    lines = source.splitlines()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        doc = ast.get_docstring(node, clean=True)
        if not doc or len(doc) < min_doc_chars or len(node.body) < 2:
            continue
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        if node.end_lineno is None or node.end_lineno - first + 1 > max_lines:
            continue
        code = textwrap.dedent("\n".join(lines[first - 1:node.end_lineno]))
        prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
        yield {"name": node.name, "signature": f"{prefix} {node.name}({ast.unparse(node.args)})",
               "docstring": doc, "code": code}


def sample_messages(sample: dict[str, str]) -> list[dict[str, str]]:
    """The chat of one sample: system, user request, assistant code."""
    request = (f"Write the Python function `{sample['signature']}`.\n\n"
               f"It is documented as follows:\n\n{sample['docstring']}")
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": request},
            {"role": "assistant", "content": sample["code"]}]


def build_or_load_sft(cfg: DataConfig, corpus, tokenizer) -> shards.TokenStore:
    """The tokenized SFT samples (a TokenStore named "sft" with a trainable mask)."""
    key = stable_hash({"corpus": corpus.fingerprint, "tokenizer": tokenizer.fingerprint, "v": 1,
                       "settings": [cfg.sft_max_samples, cfg.sft_min_docstring_chars, cfg.sft_max_function_lines]})

    def build(out: Path) -> None:
        count = 0

        def docs():
            nonlocal count
            for sample in _unique_samples(cfg, corpus):
                count += 1
                yield chat.encode_messages(tokenizer, sample_messages(sample))

        shards.write_store(out, "sft", docs(), shards.token_dtype(tokenizer.vocab_size))
        if count == 0:
            raise DataError("no docstring->function SFT samples in the corpus's train split; lower "
                            "data.sft_min_docstring_chars or use a larger corpus")
        (out / "info.json").write_text(json.dumps({"dtype": shards.token_dtype(tokenizer.vocab_size).name,
                                                   "key": key, "samples": count}))

    directory, _ = build_once(resolved_cache_dir(cfg), "sft", key, build)
    return shards.TokenStore(directory, "sft")


def _doc_samples(args: tuple[str, int, int]) -> list[dict[str, str]]:
    """Worker: the samples of one document (module level so a process pool can run it)."""
    text, min_doc_chars, max_lines = args
    return list(function_samples(text, min_doc_chars, max_lines))


def _unique_samples(cfg: DataConfig, corpus) -> Iterator[dict[str, str]]:
    seen: set[bytes] = set()
    items = [(text, cfg.sft_min_docstring_chars, cfg.sft_max_function_lines) for text in corpus.iter_texts("train")]
    for samples in corpus_scan.parallel_map(_doc_samples, items, cfg.build_workers, "sft samples", cfg.progress):
        for sample in samples:
            digest = hashlib.sha256(sample["code"].encode("utf-8")).digest()
            if digest in seen:
                continue
            seen.add(digest)
            yield sample
            if cfg.sft_max_samples and len(seen) >= cfg.sft_max_samples:
                return
