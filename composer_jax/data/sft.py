"""SFT samples: the source dispatch (`data.sft_source`) and the docstring -> function source.

Sources (`config.SftSource`): ENV_ORACLE -- the environment oracle's resolved episodes over a task
pool's training tasks (`sft_env.py`); DOCSTRINGS -- below; AUTO -- ENV_ORACLE when `data.sft_pool`
holds a task pool, else DOCSTRINGS, with a line saying which (`resolve_source`). Both are rendered
by `chat.py` in the policy's chat template, with the loss on assistant tokens only.

Docstring source: for every function or method in the train split that has a docstring of at least
`sft_min_docstring_chars`, a body beyond the docstring, and at most `sft_max_function_lines` lines,
the user asks for the function by signature and docstring and the assistant answers with its source
(decorators included, dedented). Samples are deduplicated by answer text and kept in corpus order;
`sft_max_samples` > 0 keeps the first ones. Tokenized samples are cached like the token shards
(`<cache>/sft/<key>/`, one store "sft" with a trainable mask).
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path

from composer_jax.data import chat, corpus_scan, sft_env, shards
from composer_jax.data.cache import build_once, stable_hash
from composer_jax.data.config import DataConfig, SftSource, resolved_cache_dir
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


def resolve_source(cfg: DataConfig) -> tuple[DataConfig, str]:
    """`(cfg with a concrete sft_source, a line saying which source and why)`. AUTO becomes
    ENV_ORACLE when `cfg.sft_pool` holds a task pool with training tasks, else DOCSTRINGS; an
    explicit ENV_ORACLE with an unusable pool raises `sft_env.pool_error`'s DataError."""
    source = cfg.sft_source
    if source == SftSource.AUTO:
        problem = sft_env.pool_problem(cfg.sft_pool) if cfg.sft_pool else "no task pool given (data.sft_pool)"
        if problem is None:
            source = SftSource.ENV_ORACLE
        else:
            why = f"{cfg.sft_pool}: {problem}" if cfg.sft_pool else problem
            return (dataclasses.replace(cfg, sft_source=SftSource.DOCSTRINGS),
                    f"SFT samples: docstring -> function chats from the local corpus ({why}; build one with "
                    "`python launch.py --experiment=env_generate --workdir=W` and pass --set data.sft_pool=W/pool)")
    if source == SftSource.ENV_ORACLE:
        sft_env.pool_manifest(cfg.sft_pool)
        return (dataclasses.replace(cfg, sft_source=source),
                f"SFT samples: the environment oracle's resolved episodes over the training tasks of {cfg.sft_pool}")
    return cfg, "SFT samples: docstring -> function chats from the local corpus (data.sft_source=docstrings)"


def build_or_load_sft(cfg: DataConfig, corpus, tokenizer, env_cfg=None, episode_loop=None) -> shards.TokenStore:
    """The tokenized SFT samples of `cfg.sft_source` (a TokenStore named "sft" with a trainable
    mask). AUTO is resolved here and the choice printed; `episode_loop` and `env_cfg` run the
    oracle episodes when they are not cached (`sft_env.build_or_load_env_sft`)."""
    resolved, line = resolve_source(cfg)
    if cfg.sft_source == SftSource.AUTO:
        print(line)
    if resolved.sft_source == SftSource.ENV_ORACLE:
        return sft_env.build_or_load_env_sft(resolved, tokenizer, env_cfg, episode_loop)
    return build_or_load_docstring_sft(resolved, corpus, tokenizer)


def build_or_load_docstring_sft(cfg: DataConfig, corpus, tokenizer) -> shards.TokenStore:
    """The tokenized docstring -> function samples (a TokenStore named "sft" with a trainable mask)."""
    key = stable_hash({"corpus": corpus.fingerprint, "tokenizer": tokenizer.fingerprint, "v": 2,
                       "template": chat.template_fingerprint(),
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
