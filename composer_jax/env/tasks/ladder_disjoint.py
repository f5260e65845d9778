"""Held-out modules never in training rows, checked on token ids (issue 41's acceptance).

`heldout_signatures(pool, encode)` gives, per held-out module of a ladder pool (its `split ==
"eval"` tasks), token-id sequences that any training row carrying that module would contain:
  - its workspace file name ("textwrap.py", "simplejson/decoder.py"), which every statement,
    traceback and tool call about it names;
  - its distinctive source lines: lines of at least `MIN_LINE_CHARS` characters of the held-out
    module's file that occur in no training task's files (so a shared idiom such as
    `raise ValueError(...)` is no evidence), up to `LINES_PER_MODULE` per module.
A sequence is the interior of the text's encoding (first and last token dropped), so it is found
whatever text surrounds it under a byte-level BPE. `find_leaks(rows, signatures)` returns the
(row, module, what) triples where a training row contains a signature. Pure functions: the
caller renders its rows (SFT samples, RL prompts, logged rollouts) with its own tokenizer.
"""
from __future__ import annotations

from typing import Callable, Iterable, Sequence

from composer_jax.env.tasks.pool import TaskPool
from composer_jax.env.tasks.task import Task

MIN_LINE_CHARS = 40
LINES_PER_MODULE = 6
MIN_TOKENS = 3


def task_texts(pool: TaskPool, task: Task) -> dict[str, str]:
    """rel -> text of every file of a task: its snapshot and its solution."""
    out = {}
    d = pool.task_dir(task.task_id)
    for sub in ("snapshot", "solution"):
        for p in sorted((d / sub).rglob("*")):
            if p.is_file():
                out[f"{sub}/{p.relative_to(d / sub).as_posix()}"] = p.read_text(
                    encoding="utf-8", errors="replace")
    return out


def module_file(task: Task) -> str:
    """The workspace path of the file the task's fix edits (the module)."""
    return task.edit_files[0]


def interior(ids: Sequence[int]) -> tuple[int, ...]:
    """The ids without the first and last (context-dependent under BPE merges)."""
    return tuple(ids[1:-1])


def heldout_signatures(pool: TaskPool, encode: Callable[[str], list[int]]) -> dict:
    """{held-out module: [(what, token ids), ...]} (module docstring)."""
    tasks = pool.tasks()
    train_lines = set()
    for t in tasks:
        if t.split == "train":
            for text in task_texts(pool, t).values():
                train_lines.update(ln.strip() for ln in text.splitlines())
    out: dict[str, list] = {}
    for t in tasks:
        if t.split != "eval" or t.module in out:
            continue
        rel = module_file(t)
        sigs = [(f"file name {rel}", interior(encode(f" {rel} ")))]
        source = (pool.task_dir(t.task_id) / "solution" / rel).read_text(encoding="utf-8")
        lines = [ln.strip() for ln in source.splitlines()]
        chosen = [ln for ln in dict.fromkeys(lines) if len(ln) >= MIN_LINE_CHARS
                  and ln not in train_lines][:LINES_PER_MODULE]
        sigs += [(f"source line {ln[:60]!r}", interior(encode(f"\n{ln}\n"))) for ln in chosen]
        out[t.module] = [(what, ids) for what, ids in sigs if len(ids) >= MIN_TOKENS]
    return out


def _key(ids: Iterable[int]) -> str:
    return "," + ",".join(map(str, ids)) + ","


def find_leaks(rows: Iterable[Sequence[int]], signatures: dict) -> list[tuple[int, str, str]]:
    """(row index, module, what) for each signature found in a row."""
    flat = [(m, what, _key(ids)) for m, sigs in signatures.items() for what, ids in sigs]
    leaks = []
    for i, row in enumerate(rows):
        text = _key(row)
        leaks += [(i, m, what) for m, what, key in flat if key in text]
    return leaks


def training_texts(pool: TaskPool) -> list[tuple[Task, dict[str, str]]]:
    """(task, files) of every training task of the pool: what its rows can be made from."""
    return [(t, task_texts(pool, t)) for t in pool.tasks() if t.split == "train"]
