"""The initial policy of `rl.task=lookup`: a fresh `cfg.model` after `rl.task.sft_steps` steps of
the "lm" loss on demonstrations of *training* tasks only (optimal episodes, and a fraction
`rl.task.sft_hasty` of hasty guesses; it teaches the protocol; held-out prompts are never trained
on). Deterministic in (config, `rl.task.sft_seed`), so runs of every seed share it, and cached in
memory and in the data cache (`lookup_sft/<key>.npz`). JAX: trainer and inference side only."""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import pathlib
import random
import sys
import threading
import time
import uuid

import jax
import numpy as np
from flax import nnx

from composer_jax.agent import lookup as lk
from composer_jax.config import Schedule, to_dict
from composer_jax.config.data import resolved_cache_dir
from composer_jax.data.chat import encode_messages
from composer_jax.data.targets import add_targets
from composer_jax.eval.sources import sources_hash
from composer_jax.model import init_model
from composer_jax.train.step import build


def sft_batches(tokenizer, tasks, *, steps: int, batch: int, seq_len: int, seed: int,
                hasty: float = 0.0, demo=None):
    """`steps` LM batches ([batch, seq_len], loss on assistant tokens) of demonstrations of
    `tasks` (`demo(task, rng, hasty)`, default `agent.lookup.demonstration`: optimal episodes
    with random preambles, or with probability `hasty` a guess without reading), sampled with a
    seeded generator."""
    demo = demo or lk.demonstration
    rng = random.Random(seed)
    for _ in range(steps):
        rows = {k: np.zeros((batch, seq_len), np.int32)
                for k in ("tokens", "segment_ids", "positions", "trainable")}
        for i in range(batch):
            ids, tr = encode_messages(tokenizer, demo(rng.choice(tasks), rng, hasty))
            if len(ids) > seq_len:
                raise ValueError(f"a demonstration of {len(ids)} tokens exceeds seq_len={seq_len}")
            t = len(ids)
            rows["tokens"][i, :t], rows["trainable"][i, :t] = ids, tr
            rows["segment_ids"][i, :t], rows["positions"][i, :t] = 1, np.arange(t)
        yield add_targets(rows, 0)


def sft_policy(cfg, train_tasks, steps: int, lr: float | None = None, batch: int = 16,
               demo=None):
    """A fresh `cfg.model` (seed rl.task.sft_seed) after `steps` Adam steps of the "lm" loss on
    demonstrations of `train_tasks` (sampled with rl.task.sft_seed; `demo`: `sft_batches`) at
    rl.task.sft_lr (or `lr`) on rl.task.sft_schedule -> (params, buffers) as numpy pure dicts."""
    t = cfg.rl.task
    tok = lk.lookup_tokenizer(cfg.model.vocab_size)
    batches = sft_batches(tok, train_tasks, steps=steps, batch=batch,
                          seq_len=sft_length(tok, train_tasks, cfg.rl.seq_len, demo),
                          seed=t.sft_seed, hasty=t.sft_hasty, demo=demo) if steps else iter(())
    return lm_policy(cfg, batches, steps, t.sft_lr if lr is None else lr, t.sft_schedule)


def lm_policy(cfg, batches, steps: int, lr: float = 3e-3,
              schedule: Schedule = Schedule.CONSTANT) -> tuple[dict, dict]:
    """A fresh `cfg.model` (seed rl.task.sft_seed) after one Adam step of the "lm" loss on each
    of `steps` batches of `batches` (rows with tokens, segment_ids, positions, trainable and
    targets), at peak rate `lr` on `schedule` (COSINE: down to 0 at the last step) -> (params,
    buffers) as numpy pure dicts."""
    model = init_model(cfg.model, cfg.rl.task.sft_seed, cfg.execution, cfg.train.init_std)
    if steps == 0:
        _, p, b = nnx.split(model, nnx.Param, ...)
        return jax.device_get(nnx.to_pure_dict(p)), jax.device_get(nnx.to_pure_dict(b))
    tcfg = dataclasses.replace(cfg, train=dataclasses.replace(
        cfg.train, lr=lr, warmup_steps=0, schedule=schedule, min_lr_ratio=0.0, weight_decay=0.0,
        grad_clip=1.0, steps=steps, loss="lm"))
    fns, state = build(model, tcfg, loss="lm")
    for b in batches:
        state, _ = fns.train_step(state, b)
    return jax.device_get(state.params), jax.device_get(state.buffers)


def sft_length(tokenizer, tasks, limit: int, demo=None) -> int:
    """The SFT row length: the longest demonstration of `tasks` (longest preamble), rounded up to
    a multiple of 16, at most `limit` (shorter rows: a cheaper SFT step)."""
    class _Longest(random.Random):
        def choice(self, seq):
            return max(seq, key=len)

        def random(self):
            return 1.0
    demo = demo or lk.demonstration
    longest = max(len(encode_messages(tokenizer, demo(t, _Longest()))[0])
                  for t in tasks)
    return min(limit, -(-longest // 16) * 16)


_SFT_LOCK = threading.Lock()
_SFT_MEM: dict[str, tuple] = {}


def _code_hash(train=None) -> str:
    return _module_code_hash(getattr(train, "__module__", "") or "")


@functools.lru_cache(maxsize=None)
def _module_code_hash(module: str) -> str:
    """`eval.sources.sources_hash` of the code that makes an SFT policy: this module, the
    demonstrations (`agent/lookup.py`), a variant's own `train` module, and all they import
    (model, loss, optimiser). A change there is a new cache entry, never a stale policy read
    back under the old key."""
    root = pathlib.Path(__file__).resolve().parents[2]
    entries = [pathlib.Path(__file__).resolve(), pathlib.Path(lk.__file__).resolve()]
    mod = sys.modules.get(module)
    if mod is not None and getattr(mod, "__file__", None):
        entries.append(pathlib.Path(mod.__file__).resolve())
    return sources_hash(root, entries)


def _key(cfg, salt: str = "", train=None) -> str:
    """The cache key of an SFT policy: every config field it depends on and `_code_hash`."""
    rl, t = cfg.rl, cfg.rl.task
    parts = [to_dict(cfg.model), to_dict(cfg.execution), t.sft_seed, t.sft_steps, rl.seq_len,
             list(t.levels), t.num_train_tasks, cfg.train.init_std, lk.SYSTEM, lk.PREAMBLES,
             t.sft_hasty, t.sft_lr, t.sft_schedule.value, "v2",
             _code_hash(train)] + ([salt] if salt else [])
    return hashlib.sha256(json.dumps(parts, sort_keys=True,
                                     default=str).encode()).hexdigest()[:16]


def initial_weights(cfg, train_tasks, salt: str = "", train=None) -> tuple[dict, dict]:
    """The SFT policy's (params, buffers) (module docstring); a variant family whose
    demonstrations differ passes a cache `salt` (e.g. `rl/tasks/lookup_levels.py`) and may pass
    its own `train(cfg, train_tasks, steps) -> (params, buffers)` (default `sft_policy`)."""
    key = _key(cfg, salt, train)
    with _SFT_LOCK:
        if key in _SFT_MEM:
            return _SFT_MEM[key]
        path = pathlib.Path(resolved_cache_dir(cfg.data)) / "lookup_sft" / f"{key}.npz"
        if path.exists():
            flat = dict(np.load(path))
            out = (_unflatten(flat, "p/"), _unflatten(flat, "b/"))
        else:
            t0 = time.monotonic()
            out = (train or sft_policy)(cfg, train_tasks, cfg.rl.task.sft_steps)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{uuid.uuid4().hex[:6]}.npz")
            np.savez(tmp, **_flatten(out[0], "p/"), **_flatten(out[1], "b/"))
            tmp.replace(path)
            print(f"rl.task=lookup: SFT warm start ({cfg.rl.task.sft_steps} steps) in "
                  f"{time.monotonic() - t0:.0f}s, cached in {path}", flush=True)
        _SFT_MEM[key] = out
        return out


def initial_model(cfg, sft_tasks=None, salt: str = "", train=None):
    """A `cfg.model` holding the SFT policy's weights (trained on the training tasks of
    `rl.task.sft_seed`, whatever the run's seed; a variant family passes its own `sft_tasks`, a
    cache `salt` and possibly its own `train`: `initial_weights`)."""
    t = cfg.rl.task
    if sft_tasks is None:
        sft_tasks = lk.make_tasks(t.num_train_tasks, t.sft_seed, "train", tuple(t.levels))
    params, buffers = initial_weights(cfg, sft_tasks, salt, train)
    model = init_model(cfg.model, cfg.seed, cfg.execution, cfg.train.init_std)
    graphdef, p, b = nnx.split(model, nnx.Param, ...)
    nnx.replace_by_pure_dict(p, params)
    nnx.replace_by_pure_dict(b, buffers)
    return nnx.merge(graphdef, p, b)


def _flatten(tree, prefix: str) -> dict:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = np.asarray(v)
    return out


def _unflatten(flat: dict, prefix: str) -> dict:
    out: dict = {}
    for k, v in flat.items():
        if not k.startswith(prefix):
            continue
        node = out
        *parents, leaf = k[len(prefix):].split("/")
        for p in parents:
            node = node.setdefault(int(p) if p.isdigit() else p, {})
        node[int(leaf) if leaf.isdigit() else leaf] = v
    return out
