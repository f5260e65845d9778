"""The inference engine: continuous batching over a fixed set of cache slots.

    engine = Engine.from_model(model, EngineConfig(max_batch=8, max_len=2048, spec_depth=1))
    rid = engine.submit(prompt_ids, SamplingParams(temperature=1.0, max_new_tokens=256))
    for event in engine.stream():          # StreamEvent(request_id, start, tokens, finished, ...)
        ...
    engine.completions[rid]                 # Completion: tokens, logprobs, raw_logprobs, versions...

Each step (1) applies a pending weight swap, (2) admits queued requests into free slots and
prefills them (a finished slot takes the next request at once), (3) runs one decode step — plain,
or speculative with the MTP drafts — for every generating slot, (4) applies stop conditions.
Multi-turn: a request with `session=` keeps its slot and cache after it finishes; the next request
of that session only feeds its new tokens. `end_session` frees the slot; when slots run out, idle
sessions are evicted (least recently used first) and rebuilt from their token history on return.
Randomness: request r samples its i-th step with fold_in(key_r, i), so outputs do not depend on
which slot or batch a request lands in.
"""
from __future__ import annotations

import collections
import functools
import threading
from typing import Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from composer_jax.errors import ConfigError
from composer_jax.inference import steps
from composer_jax.inference.cache import init_cache
from composer_jax.inference.config import EngineConfig
from composer_jax.inference.requests import (Completion, PromptTooLongError, QueueFullError,
                                             SessionBusyError, StreamEvent)
from composer_jax.inference.sampling import SamplerArrays, SamplingParams
from composer_jax.inference.speculative import init_spec_state

_REBUILD_OFFSET = 1 << 30     # key counters used when a cache is rebuilt (never sampled from)


def _keys(key_data, counters):
    return jax.vmap(jax.random.fold_in)(jax.random.wrap_key_data(key_data), counters)


def _prefill(graphdef, state, cache, spec, tokens, slots, starts, n_valid, forced, sp, key_data,
             counters, *, depth, capture):
    return steps.prefill_step(graphdef, state, cache, spec, tokens, slots, starts, n_valid, forced,
                              sp, _keys(key_data, counters), depth=depth, capture=capture)


def _decode(graphdef, state, cache, spec, pending, lengths, active, sp, key_data, counters, *,
            depth, capture):
    keys = _keys(key_data, counters)
    if depth == 0:
        cache, out = steps.decode_step(graphdef, state, cache, pending, lengths, active, sp, keys,
                                       capture=capture)
        return cache, spec, out
    return steps.spec_step(graphdef, state, cache, spec, pending, lengths, active, sp, keys,
                           depth=depth, capture=capture)


@functools.lru_cache(maxsize=16)
def _jitted(graphdef, depth: int, capture: bool):
    """The jitted steps, shared by every engine of the same model structure (compile once)."""
    kw = dict(depth=depth, capture=capture)
    return (jax.jit(functools.partial(_prefill, graphdef, **kw), donate_argnums=(1, 2)),
            jax.jit(functools.partial(_decode, graphdef, **kw), donate_argnums=(1, 2)))


class _Session:
    def __init__(self):
        self.tokens: list[int] = []   # the whole conversation, the last sampled token included
        self.slot: int | None = None
        self.busy = False
        self.last_used = 0


class Engine:
    def __init__(self, graphdef, state, cfg: EngineConfig = EngineConfig(), version: int = 0,
                 detokenize: Callable[[list[int]], str] | None = None):
        self.model_cfg = nnx.merge(graphdef, state).cfg
        if cfg.spec_depth > self.model_cfg.mtp_depth:
            raise ConfigError(f"inference.spec_depth={cfg.spec_depth} needs that many MTP modules; "
                              f"the model has mtp_depth={self.model_cfg.mtp_depth}")
        self.cfg, self.graphdef, self.state, self.version = cfg, graphdef, state, version
        self.detokenize = detokenize
        b, depth = cfg.max_batch, cfg.spec_depth
        self.cache = init_cache(self.model_cfg, b, cfg.max_len, with_mtp=depth > 0)
        self.spec = init_spec_state(b, depth, self.model_cfg.vocab_size) if depth else None
        self._prefill_fn, self._decode_fn = _jitted(graphdef, depth, cfg.capture_router)
        self._base_key = jax.random.key(cfg.seed)
        self.lengths = np.zeros(b, np.int32)
        self.pending = np.zeros(b, np.int32)
        self._slot_tokens: list[list[int]] = [[] for _ in range(b)]   # processed + pending
        self._slot_req: list[Completion | None] = [None] * b
        self._slot_key = np.zeros((b, 2), np.uint32)
        self._slot_params = [SamplingParams(temperature=0.0)] * b
        self._slot_prompt_len = np.zeros(b, np.int32)    # sequence length when the request began
        self._sessions: dict[str, _Session] = {}
        self._queue: collections.deque[int] = collections.deque()
        self._lock = threading.Lock()
        self._pending_swap = None
        self._clock = 0
        self._next_id = 0
        self.completions: dict[int, Completion] = {}
        self.stats = collections.Counter()
        self.accepted_at_depth = np.zeros(max(depth, 1), np.int64)
        self.attempted_at_depth = np.zeros(max(depth, 1), np.int64)

    @classmethod
    def from_model(cls, model, cfg: EngineConfig = EngineConfig(), **kw) -> "Engine":
        graphdef, state = nnx.split(model)
        return cls(graphdef, state, cfg, **kw)

    # ---------------------------------------------------------------- requests

    def submit(self, prompt: Sequence[int], params: SamplingParams = SamplingParams(),
               session: str | None = None) -> int:
        """Queues a request; returns its id. With `session`, `prompt` holds only the new tokens of
        this turn (tool results, the next user message) and the conversation's cache is reused."""
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise ValueError("empty prompt: give at least one token")
        v = self.model_cfg.vocab_size
        if min(prompt) < 0 or max(prompt) >= v:
            raise ValueError(f"prompt token ids must be in [0, {v}), got {min(prompt)}..{max(prompt)}")
        if params.stop_strings and self.detokenize is None:
            raise ConfigError("stop_strings need an engine built with detokenize=")
        with self._lock:
            history = []
            if session is not None and session in self._sessions:
                s = self._sessions[session]
                if s.busy:
                    raise SessionBusyError(f"session {session!r} is still generating its last turn")
                history = s.tokens
            total = len(history) + len(prompt)
            if total >= self.cfg.max_len:
                raise PromptTooLongError(
                    f"prompt of {len(prompt)} tokens (+ {len(history)} of conversation history) = "
                    f"{total} tokens does not fit the context of {self.cfg.max_len} tokens "
                    f"(inference.max_len), which must also hold at least one new token")
            if len(self._queue) >= self.cfg.max_queue:
                raise QueueFullError(f"{len(self._queue)} requests are queued "
                                     f"(inference.max_queue={self.cfg.max_queue}); retry later")
            rid = self._next_id
            self._next_id += 1
            self.completions[rid] = Completion(rid, prompt, params, session)
            if session is not None:
                s = self._sessions.setdefault(session, _Session())
                s.busy = True
            self._queue.append(rid)
            return rid

    def end_session(self, session: str) -> None:
        """Forgets a conversation and frees its cache slot."""
        with self._lock:
            s = self._sessions.pop(session, None)
            if s is not None and s.slot is not None and self._slot_req[s.slot] is None:
                self._free(s.slot)

    def swap_weights(self, state, version: int) -> None:
        """New parameters (same structure) for the next step on; running sequences keep going."""
        with self._lock:
            self._pending_swap = (state, version)

    @property
    def idle(self) -> bool:
        return not self._queue and all(r is None for r in self._slot_req)

    # ---------------------------------------------------------------- the loop

    def step(self) -> list[StreamEvent]:
        """One engine step; returns the new tokens of every request that got some."""
        with self._lock:
            self._clock += 1
            events: dict[int, list] = {}
            if self._pending_swap is not None:
                self._apply_swap()
            self._admit(events)
            active = np.array([r is not None and not r.finished for r in self._slot_req])
            if active.any():
                self._decode(active, events)
            return [self._event(rid, start) for rid, start in events.items()]

    def stream(self) -> Iterator[StreamEvent]:
        """Steps until nothing is queued or generating, yielding events as they come."""
        while not self.idle:
            yield from self.step()

    def run(self) -> dict[int, Completion]:
        """Steps until idle; returns all completions."""
        for _ in self.stream():
            pass
        return self.completions

    # ---------------------------------------------------------------- internals

    def _event(self, rid: int, start: int) -> StreamEvent:
        c = self.completions[rid]
        return StreamEvent(rid, start, tuple(c.tokens[start:]), c.finished, c.finish_reason)

    def _free(self, slot: int) -> None:
        self._slot_req[slot] = None
        self._slot_tokens[slot] = []
        self.lengths[slot] = 0

    def _sampler(self, slots) -> SamplerArrays:
        return SamplerArrays.build([self._slot_params[s] for s in slots])

    def _take_slot(self) -> int | None:
        held = {s.slot for s in self._sessions.values() if s.slot is not None}
        for slot in range(self.cfg.max_batch):
            if self._slot_req[slot] is None and slot not in held:
                return slot
        idle = [s for s in self._sessions.values()
                if s.slot is not None and self._slot_req[s.slot] is None]
        if not idle:
            return None
        victim = min(idle, key=lambda s: s.last_used)
        slot, victim.slot = victim.slot, None
        self._free(slot)
        return slot

    def _admit(self, events) -> None:
        jobs = []   # (slot, chunk tokens, start, forced)
        while self._queue:
            c = self.completions[self._queue[0]]
            s = self._sessions.get(c.session) if c.session is not None else None
            slot = s.slot if s is not None and s.slot is not None else self._take_slot()
            if slot is None:
                break
            self._queue.popleft()
            history = s.tokens if s is not None else []
            if s is not None:
                s.slot, s.last_used = slot, self._clock
            if len(self._slot_tokens[slot]) != len(history):   # new slot or evicted session
                self._slot_tokens[slot], self.lengths[slot] = [], 0
            full = history + c.prompt
            self._slot_tokens[slot] = list(full)
            self._slot_req[slot] = c
            self._slot_params[slot] = c.params
            seed = c.params.seed
            key = jax.random.key(seed) if seed is not None else jax.random.fold_in(
                self._base_key, c.request_id)
            self._slot_key[slot] = np.asarray(jax.random.key_data(key))
            self._slot_prompt_len[slot] = len(full)
            start = int(self.lengths[slot])
            jobs.append((slot, full[start:], start, -1, 0))
            events.setdefault(c.request_id, 0)
        for slot, toks, _, out in self._run_prefill(jobs):
            c = self._slot_req[slot]
            if out["chunk_router"] is not None:
                c.prompt_router_indices = out["chunk_router"][:len(toks) - 1]
            self._advance(slot, [out])

    def _run_prefill(self, jobs):
        """Prefills jobs (slot, chunk, start, forced token or -1, key counter), grouped by padded
        chunk length, `prefill_batch` rows per call; yields (slot, chunk, start, token info)."""
        groups = collections.defaultdict(list)
        for job in jobs:
            n = len(job[1])
            bucket = max(self.cfg.min_prefill_bucket, 1 << (n - 1).bit_length())
            groups[min(bucket, self.cfg.max_len)].append(job)
        rows = self.cfg.prefill_batch
        for t, bucket_jobs in sorted(groups.items()):
            for at in range(0, len(bucket_jobs), rows):
                yield from self._prefill_group(t, bucket_jobs[at:at + rows])

    def _prefill_group(self, t: int, group):
        rows = self.cfg.prefill_batch
        padded = group + [group[-1]] * (rows - len(group))   # duplicates write identical data
        tokens = np.zeros((rows, t), np.int32)
        for i, job in enumerate(padded):
            tokens[i, :len(job[1])] = job[1]
        slots = np.array([g[0] for g in padded], np.int32)
        col = lambda k: jnp.asarray([g[k] for g in padded], jnp.int32)
        self.stats["prefill_tokens"] += sum(len(g[1]) for g in group)
        self.stats["prefill_calls"] += 1
        self.cache, self.spec, out, chunk_router = self._prefill_fn(
            self.state, self.cache, self.spec, jnp.asarray(tokens), jnp.asarray(slots), col(2),
            jnp.asarray([len(g[1]) for g in padded], jnp.int32), col(3), self._sampler(slots),
            jnp.asarray(self._slot_key[slots]), col(4))
        host = jax.device_get(out)
        chunk_router = None if chunk_router is None else np.asarray(chunk_router)
        for i, (slot, toks, start, _, _) in enumerate(group):
            info = {"token": int(host.tokens[i, 0]), "logp": float(host.logp[i, 0]),
                    "raw": float(host.raw_logp[i, 0]),
                    "router": None if host.router is None else host.router[:, i, 0],
                    "chunk_router": None if chunk_router is None
                    else np.moveaxis(chunk_router[:, i], 1, 0)}
            self.lengths[slot] = start + len(toks)
            yield slot, toks, start, info

    def _decode(self, active, events) -> None:
        b = self.cfg.max_batch
        counters = np.array([len(r.tokens) if r is not None else 0 for r in self._slot_req],
                            np.int32)
        self.stats["decode_steps"] += 1
        self.cache, self.spec, out = self._decode_fn(
            self.state, self.cache, self.spec, jnp.asarray(self.pending), jnp.asarray(self.lengths),
            jnp.asarray(active), self._sampler(range(b)), jnp.asarray(self._slot_key),
            jnp.asarray(counters))
        host = jax.device_get(out)
        for slot in np.nonzero(active)[0]:
            c = self._slot_req[slot]
            n = int(host.n_new[slot])
            if self.cfg.spec_depth:
                self.stats["verify_rows"] += 1
                self.stats["verify_tokens"] += n
                self.attempted_at_depth[:min(n, self.cfg.spec_depth)] += 1
                self.accepted_at_depth[:n - 1] += 1
            events.setdefault(c.request_id, len(c.tokens))
            self._advance(slot, [{"token": int(host.tokens[slot, j]),
                                  "logp": float(host.logp[slot, j]),
                                  "raw": float(host.raw_logp[slot, j]),
                                  "router": None if host.router is None else host.router[:, slot, j]}
                                 for j in range(n)])

    def _advance(self, slot: int, new: list[dict]) -> None:
        """Appends sampled tokens to the slot's request until a stop condition; updates the slot."""
        c = self._slot_req[slot]
        kept = 0
        for item in new:
            c.tokens.append(item["token"])
            c.logprobs.append(item["logp"])
            c.raw_logprobs.append(item["raw"])
            c.versions.append(self.version)
            if item["router"] is not None:
                c.router_indices.append(item["router"])
            kept += 1
            c.finish_reason = self._stop_reason(slot, c)
            if c.finish_reason:
                break
        self.stats["generated_tokens"] += kept
        # The cache holds the fed token and the kept tokens before the last, which is pending.
        toks = self._slot_tokens[slot]
        toks.extend(c.tokens[-kept:])
        self.lengths[slot] = len(toks) - 1
        self.pending[slot] = toks[-1]
        if c.finished:
            self._finish(slot, c)

    def _stop_reason(self, slot: int, c: Completion) -> str | None:
        p = c.params
        if c.tokens[-1] in p.stop_tokens:
            return "stop_token"
        if p.stop_strings:
            text = self.detokenize(c.tokens)
            if any(s in text for s in p.stop_strings):
                return "stop_string"
        if len(c.tokens) >= p.max_new_tokens:
            return "max_new_tokens"
        if self._slot_prompt_len[slot] + len(c.tokens) >= self.cfg.max_len:
            return "length"
        return None

    def _finish(self, slot: int, c: Completion) -> None:
        self._slot_req[slot] = None
        if c.session is not None and c.session in self._sessions:
            s = self._sessions[c.session]
            s.tokens, s.busy, s.last_used = list(self._slot_tokens[slot]), False, self._clock
        else:
            self._free(slot)

    def _apply_swap(self) -> None:
        state, version = self._pending_swap
        self._pending_swap = None
        self.state, self.version = state, version
        self.stats["weight_swaps"] += 1
        if not self.cfg.reprefill_on_swap:
            return
        held = {s.slot for s in self._sessions.values() if s.slot is not None}
        jobs = [(slot, self._slot_tokens[slot][:-1], 0, self._slot_tokens[slot][-1],
                 _REBUILD_OFFSET + len(self._slot_tokens[slot]))
                for slot in range(self.cfg.max_batch)
                if (self._slot_req[slot] is not None or slot in held)
                and len(self._slot_tokens[slot]) > 1]
        for slot, _, _, _ in self._run_prefill(jobs):   # the pending token is forced, not sampled
            self.lengths[slot] = len(self._slot_tokens[slot]) - 1

    def speculation_metrics(self) -> dict:
        """Acceptance rate per draft depth (given the earlier drafts were accepted) and the mean
        number of tokens emitted per verification (mean accepted length, bonus token included)."""
        rows = max(self.stats["verify_rows"], 1)
        rate = self.accepted_at_depth / np.maximum(self.attempted_at_depth, 1)
        return {"acceptance_per_depth": [float(x) for x in rate],
                "mean_accepted_length": self.stats["verify_tokens"] / rows}
