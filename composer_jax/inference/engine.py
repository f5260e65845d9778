"""The inference engine: continuous batching over a fixed set of cache slots.

Step-driven (one thread):

    engine = Engine.from_model(model, EngineConfig(max_batch=8, max_len=2048, speculative=True))
    rid = engine.submit(prompt_ids, SamplingParams(temperature=1.0, max_new_tokens=256))
    for event in engine.stream():          # StreamEvent(request_id, start, tokens, finished, ...)
        ...
    engine.completions[rid]                 # Completion: tokens, logprobs, raw_logprobs, versions...

As a service shared by many threads (episodes):

    with Engine(graphdef, state, cfg).start() as engine:     # a background driver thread steps
        fut = engine.request(prompt_ids, params, session="episode-17")   # concurrent Future
        completion = fut.result()                # or engine.wait(rid); engine.cancel(rid)
        engine.swap_weights(new_state, version=8)    # returns at once; applied between steps

Locking: `_lock` guards the host bookkeeping (queue, sessions, completions, futures) and is
released around every device call, so `submit`, `cancel`, `swap_weights` and `end_session` never
wait for a device step; `_step_lock` makes steps run one at a time. Slot state (caches, lengths,
pending tokens) is only touched by the stepping thread; `end_session` and `cancel` of a running
request are deferred to the start of the next step when a step is in flight.

Each step (1) applies a pending weight swap, (2) admits queued requests into free slots and
prefills them (a finished slot takes the next request at once), (3) runs one decode step — plain,
or speculative with the MTP drafts — for every generating slot, (4) applies stop conditions.
Multi-turn: a request with `session=` keeps its slot and cache after it finishes; the next request
of that session only feeds its new tokens. `end_session` frees the slot; when slots run out, idle
sessions are evicted (least recently used first) and rebuilt from their token history on return.
Randomness: request r samples its i-th token with fold_in(key_r, i), so outputs do not depend on
which slot or batch a request lands in, nor on speculation (`inference.speculative`).
"""
from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import functools
import threading
import time
from typing import Callable, Iterator, Sequence

import jax
import numpy as np
from flax import nnx

from composer_jax.errors import ConfigError
from composer_jax.inference import steps
from composer_jax.inference.cache import init_cache
from composer_jax.inference.config import EngineConfig
from composer_jax.protocol.requests import (Completion, EngineStoppedError, PromptTooLongError,
                                             QueueFullError, SessionBusyError, StreamEvent)
from composer_jax.inference.sampling import SamplerArrays, SamplingParams
from composer_jax.inference.speculative import init_spec_state

_REBUILD_OFFSET = 1 << 30     # key counters used when a cache is rebuilt (never sampled from)


def on_device(state):
    """The parameter pytree with every host (numpy) leaf placed on the default device once.
    A numpy leaf passed to a jitted step is copied host -> device on every call: from a loaded
    run (numpy weights) that copy was over half of a batch-1 decode step."""
    return jax.tree.map(lambda a: a if isinstance(a, jax.Array) else jax.device_put(a), state)


def _decode(graphdef, state, cache, spec, pending, lengths, active, sp, key_data, counters, *,
            depth, capture):
    if depth == 0:
        cache, out = steps.decode_step(graphdef, state, cache, pending, lengths, active, sp,
                                       key_data, counters, capture=capture)
        return cache, spec, out
    return steps.spec_step(graphdef, state, cache, spec, pending, lengths, active, sp, key_data,
                           counters, depth=depth, capture=capture)


def _on_leaves(fn, graphdef, treedef, **kw):
    """fn(graphdef, state, ...) as a function of the state's leaves: a flat list of arrays is
    parsed by jit's C++ dispatch, while an nnx State is flattened in Python on every call
    (~0.15 ms per step for the 53 leaves of cpt_debug, a quarter of a batch-1 decode step)."""
    def step(leaves, *args):
        return fn(graphdef, jax.tree.unflatten(treedef, leaves), *args, **kw)
    return step


@functools.lru_cache(maxsize=16)
def _jitted(graphdef, treedef, depth: int, capture: bool):
    """The jitted steps, shared by every engine of the same model structure (compile once); they
    take the parameters as the flat leaves of a state whose structure is `treedef`."""
    kw = dict(depth=depth, capture=capture)
    return (jax.jit(_on_leaves(steps.prefill_step, graphdef, treedef, **kw),
                    donate_argnums=(1, 2)),
            jax.jit(_on_leaves(_decode, graphdef, treedef, **kw), donate_argnums=(1, 2)))


class _Session:
    def __init__(self):
        self.tokens: list[int] = []   # the whole conversation, the last sampled token included
        self.slot: int | None = None
        self.busy = False
        self.last_used = 0


class Engine:
    def __init__(self, graphdef, state, cfg: EngineConfig = EngineConfig(), version: int = 0,
                 detokenize: Callable[[list[int]], str] | None = None):
        model = nnx.merge(graphdef, state)
        self.model_cfg, self.execution = model.cfg, model.execution
        cfg.check_model(self.model_cfg.mtp_depth)     # speculation drafts with the MTP modules
        self.cfg, self.graphdef, self.version = cfg, graphdef, version
        self.detokenize = detokenize
        b, depth = cfg.max_batch, cfg.draft_depth
        self.cache = init_cache(self.model_cfg, b, cfg.max_len, with_mtp=depth > 0,
                                dtype=self.execution.compute_dtype)
        self.spec = init_spec_state(b, depth) if depth else None
        self._treedef = None           # the parameters' structure the jitted steps were built for
        self._set_state(state)
        self._base_key = jax.random.key(cfg.seed)
        self.lengths = np.zeros(b, np.int32)
        self.pending = np.zeros(b, np.int32)
        self._slot_tokens: list[list[int]] = [[] for _ in range(b)]   # processed + pending
        self._slot_req: list[Completion | None] = [None] * b
        self._slot_sess: list[_Session | None] = [None] * b      # the session a request runs in
        self._slot_key = np.zeros((b, 2), np.uint32)
        self._slot_params = [SamplingParams(temperature=0.0)] * b
        self._slot_prompt_len = np.zeros(b, np.int32)    # sequence length when the request began
        self._sessions: dict[str, _Session] = {}
        self._queue: collections.deque[int] = collections.deque()
        self._lock = threading.Lock()               # host bookkeeping (see the module doc)
        self._work = threading.Condition(self._lock)
        self._step_lock = threading.Lock()          # one step at a time
        self._futures: dict[int, concurrent.futures.Future] = {}
        self._resolved: list[tuple[concurrent.futures.Future, Completion]] = []
        self._finished: collections.deque[int] = collections.deque()
        self._cancel: set[int] = set()
        self._end: list[_Session] = []
        self._driver: threading.Thread | None = None
        self._stopping = False
        self._driver_error: BaseException | None = None
        self._pending_swap = None
        self._clock = 0
        self._next_id = 0
        self.completions: dict[int, Completion] = {}
        self.stats = collections.Counter()
        self.accepted_at_depth = np.zeros(max(depth, 1), np.int64)
        self.attempted_at_depth = np.zeros(max(depth, 1), np.int64)

    def _set_state(self, state) -> None:
        """The parameters the next step uses (on the device), as a pytree and as flat leaves."""
        self.state = on_device(state)
        self._leaves, treedef = jax.tree.flatten(self.state)
        if self._treedef is None or treedef != self._treedef:
            self._treedef = treedef
            self._prefill_fn, self._decode_fn = _jitted(self.graphdef, treedef,
                                                        self.cfg.draft_depth,
                                                        self.cfg.capture_router)

    @classmethod
    def from_model(cls, model, cfg: EngineConfig = EngineConfig(), **kw) -> "Engine":
        graphdef, state = nnx.split(model)
        return cls(graphdef, state, cfg, **kw)

    # ---------------------------------------------------------------- requests

    def submit(self, prompt: Sequence[int], params: SamplingParams = SamplingParams(),
               session: str | None = None) -> int:
        """Queues a request; returns its id at once (no device work). With `session`, `prompt`
        holds only the new tokens of this turn (tool results, the next user message) and the
        conversation's cache is reused."""
        return self._submit(prompt, params, session)[0]

    def request(self, prompt: Sequence[int], params: SamplingParams = SamplingParams(),
                session: str | None = None) -> concurrent.futures.Future:
        """Like `submit`, but returns a Future resolved with the finished Completion (the future
        has `.request_id`). Needs a started engine (or someone else calling `step`)."""
        return self._submit(prompt, params, session)[1]

    def _submit(self, prompt, params, session):
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise ValueError("empty prompt: give at least one token")
        v = self.model_cfg.vocab_size
        if min(prompt) < 0 or max(prompt) >= v:
            raise ValueError(f"prompt token ids must be in [0, {v}), got {min(prompt)}..{max(prompt)}")
        if params.forced_tokens and (min(params.forced_tokens) < 0
                                     or max(params.forced_tokens) >= v):
            raise ValueError(f"forced token ids must be in [0, {v})")
        if params.forced_tokens and self.cfg.draft_depth:
            raise ConfigError("forced_tokens need plain decoding (inference.speculative=false, "
                              "inference.spec_depth=0)")
        if params.stop_strings and self.detokenize is None:
            raise ConfigError("stop_strings need an engine built with detokenize=")
        with self._lock:
            if self._driver_error is not None:
                raise EngineStoppedError(f"the engine's driver thread crashed: "
                                         f"{self._driver_error!r}") from self._driver_error
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
            self.completions[rid] = Completion(rid, prompt, params, session,
                                               submit_time=time.monotonic())
            fut = concurrent.futures.Future()
            fut.request_id = rid
            self._futures[rid] = fut
            if session is not None:
                s = self._sessions.setdefault(session, _Session())
                s.busy = True
            self._queue.append(rid)
            self._work.notify_all()
            return rid, fut

    def future(self, request_id: int) -> concurrent.futures.Future:
        """The Future of a request (resolved at once if it already finished and is still kept)."""
        with self._lock:
            if request_id in self._futures:
                return self._futures[request_id]
            c = self.completions.get(request_id)
        if c is None or not c.finished:
            raise KeyError(f"unknown request id {request_id} (never submitted, or finished and "
                           f"pruned: keep the Future from `request` instead)")
        fut = concurrent.futures.Future()
        fut.set_result(c)
        return fut

    def wait(self, request_id: int, timeout: float | None = None) -> Completion:
        """Blocks until the request finishes and returns its Completion, removing it from
        `completions`. Without a running driver, this thread steps the engine itself."""
        fut = self.future(request_id)
        if not self.running:
            while not fut.done():
                if self.idle and not fut.done():
                    raise EngineStoppedError(f"request {request_id} cannot finish: the engine is idle")
                self.step()
        c = fut.result(timeout)
        with self._lock:
            self.completions.pop(request_id, None)
        return c

    def cancel(self, request_id: int) -> bool:
        """Stops a request: a queued one at once, a running one at the start of the next step
        (its tokens so far are kept). It finishes with finish_reason "cancelled". Returns False
        when the request is unknown or already finished."""
        with self._lock:
            c = self.completions.get(request_id)
            if c is None or c.finished:
                return False
            if request_id in self._queue:
                self._queue.remove(request_id)
                c.finish_reason = "cancelled"
                if c.session is not None and c.session in self._sessions:
                    self._sessions[c.session].busy = False
                self._record_finished(c)
            else:
                self._cancel.add(request_id)
                self._work.notify_all()
        self._resolve_futures()
        return True

    def end_session(self, session: str) -> None:
        """Forgets a conversation at once (a later request with this name starts afresh) and
        frees its cache slot (now, or at the start of the next step when one is in flight)."""
        with self._lock:
            s = self._sessions.pop(session, None)
            if s is None or s.slot is None:
                return
            self._end.append(s)
            self._work.notify_all()
        if self._step_lock.acquire(blocking=False):
            try:
                with self._lock:
                    self._free_ended()
            finally:
                self._step_lock.release()

    def _free_ended(self) -> None:
        """Frees the slots of ended sessions unless a request or another session uses them."""
        ended, self._end = self._end, []
        held = {s.slot for s in self._sessions.values() if s.slot is not None}
        for s in ended:
            if self._slot_req[s.slot] is None and s.slot not in held:
                self._free(s.slot)

    def swap_weights(self, state, version: int) -> None:
        """New parameters (same structure) for the next step on; running sequences keep going.
        Returns at once; every token records the version of the step that sampled it."""
        state = on_device(state)         # the copy happens here, not in the decode loop
        with self._lock:
            self._pending_swap = (state, version)
            self._work.notify_all()

    # ---------------------------------------------------------------- the driver

    @property
    def running(self) -> bool:
        return self._driver is not None and self._driver.is_alive()

    def start(self) -> "Engine":
        """Starts the background driver thread that steps whenever there is work."""
        with self._lock:
            if self._driver_error is not None:
                raise EngineStoppedError(f"the engine's driver crashed: {self._driver_error!r}")
            if self.running:
                return self
            self._stopping = False
            self._driver = threading.Thread(target=self._drive, name="engine-driver", daemon=True)
            self._driver.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stops the driver after its current step. Queued and running requests stay; a later
        `start` (or `step`) continues them."""
        with self._lock:
            self._stopping = True
            self._work.notify_all()
            driver = self._driver
        if driver is not None:
            driver.join(timeout)
        self._driver = None

    def __enter__(self) -> "Engine":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _has_work(self) -> bool:
        return bool(self._queue or self._cancel or self._end or self._pending_swap is not None
                    or any(r is not None for r in self._slot_req))

    def _drive(self) -> None:
        try:
            while True:
                with self._lock:
                    while not self._stopping and not self._has_work():
                        self._work.wait()
                    if self._stopping:
                        return
                self.step()
        except BaseException as exc:   # noqa: BLE001 - every waiter must learn of the crash
            with self._lock:
                self._driver_error = exc
                waiting = list(self._futures.values())
                self._futures.clear()
            err = EngineStoppedError(f"the engine's driver thread crashed: {exc!r}")
            for fut in waiting:
                if not fut.done():
                    fut.set_exception(err)

    @property
    def idle(self) -> bool:
        with self._lock:
            return not self._queue and all(r is None for r in self._slot_req)

    # ---------------------------------------------------------------- the loop

    def step(self) -> list[StreamEvent]:
        """One engine step; returns the new tokens of every request that got some."""
        with self._step_lock:
            with self._lock:
                self._clock += 1
                events: dict[int, tuple[Completion, int]] = {}
                self._apply_control(events)
                if self._pending_swap is not None:
                    self._apply_swap()
                self._admit(events)
                active = np.array([r is not None and not r.finished for r in self._slot_req])
                if active.any():
                    self._decode(active, events)
                out = [self._event(c, start) for c, start in events.values()]
            self._resolve_futures()
            return out

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

    @contextlib.contextmanager
    def _unlocked(self):
        """Releases the bookkeeping lock around device work (the caller holds it)."""
        self._lock.release()
        try:
            yield
        finally:
            self._lock.acquire()

    def _apply_control(self, events) -> None:
        """Deferred session ends and cancellations of running requests."""
        self._free_ended()
        if not self._cancel:
            return
        for slot, c in enumerate(self._slot_req):
            if c is not None and c.request_id in self._cancel:
                c.finish_reason = "cancelled"
                events.setdefault(c.request_id, (c, len(c.tokens)))
                self._finish(slot, c)
        self._cancel.clear()

    def _record_finished(self, c: Completion) -> None:
        """Marks the request's future for resolution and prunes the oldest finished ones."""
        c.finish_time = time.monotonic()
        fut = self._futures.pop(c.request_id, None)
        if fut is not None:
            self._resolved.append((fut, c))
        self._finished.append(c.request_id)
        while len(self._finished) > self.cfg.max_finished:
            self.completions.pop(self._finished.popleft(), None)

    def _resolve_futures(self) -> None:
        """Resolves finished futures outside the lock (their callbacks may call the engine)."""
        with self._lock:
            done, self._resolved = self._resolved, []
        for fut, c in done:
            if not fut.done():
                fut.set_result(c)

    def _event(self, c: Completion, start: int) -> StreamEvent:
        return StreamEvent(c.request_id, start, tuple(c.tokens[start:]), c.finished, c.finish_reason)

    def _free(self, slot: int) -> None:
        self._slot_req[slot] = None
        self._slot_tokens[slot] = []
        self.lengths[slot] = 0

    def _sampler(self, slots) -> SamplerArrays:
        forced = []
        for s in slots:
            c = self._slot_req[s]
            ft = c.params.forced_tokens if c is not None else ()
            forced.append(ft[len(c.tokens)] if ft and len(c.tokens) < len(ft) else -1)
        return SamplerArrays.build([self._slot_params[s] for s in slots], forced)

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
            self._slot_sess[slot] = s
            self._slot_params[slot] = c.params
            seed = c.params.seed
            key = jax.random.key(seed) if seed is not None else jax.random.fold_in(
                self._base_key, c.request_id)
            self._slot_key[slot] = np.asarray(jax.random.key_data(key))
            self._slot_prompt_len[slot] = len(full)
            start = int(self.lengths[slot])
            jobs.append((slot, full[start:], start, -1, 0))
            events.setdefault(c.request_id, (c, 0))
        for slot, toks, _, out in self._run_prefill(jobs):
            c = self._slot_req[slot]
            if out["chunk_router"] is not None:
                c.prompt_router_indices = out["chunk_router"][:len(toks) - 1]
                c.prompt_router_start = out["start"]
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
        col = lambda k: np.asarray([g[k] for g in padded], np.int32)
        self.stats["prefill_tokens"] += sum(len(g[1]) for g in group)
        self.stats["prefill_calls"] += 1
        # Host arrays go to the jitted step as they are (fresh copies: the step runs unlocked).
        args = (self._leaves, self.cache, self.spec, tokens, slots, col(2),
                np.asarray([len(g[1]) for g in padded], np.int32), col(3), self._sampler(slots),
                self._slot_key[slots], col(4))
        with self._unlocked():
            self.cache, self.spec, out, chunk_router = self._prefill_fn(*args)
            host = jax.device_get(out)
            chunk_router = None if chunk_router is None else np.asarray(chunk_router)
        for i, (slot, toks, start, _, _) in enumerate(group):
            info = {"token": int(host.tokens[i, 0]), "logp": float(host.logp[i, 0]),
                    "raw": float(host.raw_logp[i, 0]),
                    "router": None if host.router is None else host.router[:, i, 0],
                    "chunk_router": None if chunk_router is None
                    else np.moveaxis(chunk_router[:, i], 1, 0), "start": start}
            self.lengths[slot] = start + len(toks)
            yield slot, toks, start, info

    def _decode(self, active, events) -> None:
        b = self.cfg.max_batch
        counters = np.array([len(r.tokens) if r is not None else 0 for r in self._slot_req],
                            np.int32)
        self.stats["decode_steps"] += 1
        args = (self._leaves, self.cache, self.spec, self.pending.copy(), self.lengths.copy(),
                np.asarray(active, bool), self._sampler(range(b)), self._slot_key.copy(), counters)
        with self._unlocked():
            self.cache, self.spec, out = self._decode_fn(*args)
            host = jax.device_get(out)
        for slot in np.nonzero(active)[0]:
            c = self._slot_req[slot]
            n = int(host.n_new[slot])
            if self.cfg.draft_depth:
                self.stats["verify_rows"] += 1
                self.stats["verify_tokens"] += n
                self.attempted_at_depth[:min(n, self.cfg.draft_depth)] += 1
                self.accepted_at_depth[:n - 1] += 1
            events.setdefault(c.request_id, (c, len(c.tokens)))
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
        if p.forced_tokens and len(c.tokens) >= len(p.forced_tokens):
            return "forced"
        return None

    def _finish(self, slot: int, c: Completion) -> None:
        self._slot_req[slot] = None
        s, self._slot_sess[slot] = self._slot_sess[slot], None
        if s is not None and self._sessions.get(c.session) is s:    # not ended meanwhile
            s.tokens, s.busy, s.last_used = list(self._slot_tokens[slot]), False, self._clock
        else:
            self._free(slot)
        self._record_finished(c)

    def _apply_swap(self) -> None:
        state, version = self._pending_swap
        self._pending_swap = None
        self._set_state(state)
        self.version = version
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
