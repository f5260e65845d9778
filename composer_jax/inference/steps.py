"""The engine's jittable steps: prefill a chunk into slots, one plain decode step, one speculative
step. Pure functions of (params, cache, per-slot arrays); the engine jits them once per shape.

Per slot the engine keeps `lengths` (positions already in the cache) and `pending` (the last
sampled token, at position `lengths`, not yet in the cache). A step feeds `pending` (plus drafts),
writes the cache and samples what follows.

Shape glossary: B slots, n rows being prefilled, T chunk length, W = 1 + draft depth, V vocab,
K experts per token, Lm MoE layers.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from composer_jax.inference.cache import Cache, gather_slots, scatter_slots
from composer_jax.inference.forward import forward_cached, make_window
from composer_jax.inference.sampling import (SamplerArrays, all_greedy, processed_logprobs,
                                             raw_logprobs, sample, sample_at, take)
from composer_jax.inference.speculative import SpecState, accept, draft


@struct.dataclass
class StepOut:
    """tokens/logp/raw_logp [B,W] (the first n_new [B] are real), router [Lm,B,W,K] or None:
    the experts of the forward pass that produced each token."""
    tokens: jax.Array
    logp: jax.Array
    raw_logp: jax.Array
    n_new: jax.Array
    router: jax.Array | None


def prefill_step(graphdef, state, cache: Cache, spec: SpecState | None, tokens, slots, starts,
                 n_valid, forced, sp: SamplerArrays, key_data, counters, *, depth: int,
                 capture: bool):
    """Feeds chunks tokens [n,T] (row i: n_valid[i] real tokens at positions starts[i]..) into
    cache slots [n], then samples the next token, token index counters[i] of its request (or
    takes forced[i] when >= 0, used to rebuild a cache whose next token is already known). With
    depth > 0 also drafts from the MTP modules. key_data [n,2]: the requests' keys.

    Returns (cache, spec, StepOut with W = 1, chunk router indices [Lm,n,T,K] or None).
    """
    n, t = tokens.shape
    sub = gather_slots(cache, slots)
    win = make_window(starts, n_valid, t, cache.max_len)
    out, sub = forward_cached(graphdef, state, sub, tokens, win)
    rows = jnp.arange(n)
    last = n_valid - 1
    tok, lp, raw, _ = sample(out.logits[rows, last], sp, key_data, counters)
    tok = jnp.where(forced >= 0, forced, tok)
    router = out.router_indices if capture else None
    step_router = None if router is None else router[:, rows, last][:, :, None]
    if depth > 0:
        nxt = jnp.concatenate([tokens[:, 1:], jnp.zeros((n, 1 + depth), jnp.int32)], axis=1)
        nxt = nxt.at[rows, last].set(tok)
        d, sub = draft(graphdef, state, sub, depth, out.hidden, nxt, last, starts, n_valid > 0,
                       sp, key_data, counters[:, None] + 1 + jnp.arange(depth))
        spec = SpecState(spec.drafts.at[slots].set(d))
    cache = scatter_slots(cache, slots, sub)
    res = StepOut(tok[:, None], lp[:, None], raw[:, None], jnp.ones((n,), jnp.int32), step_router)
    return cache, spec, res, router


def decode_step(graphdef, state, cache: Cache, pending, lengths, active, sp: SamplerArrays,
                key_data, counters, *, capture: bool):
    """One token for every active slot: pending [B] at positions lengths [B], token index
    counters [B] of each slot's request (key_data [B,2]) -> (cache, StepOut)."""
    win = make_window(lengths, active.astype(jnp.int32), 1, cache.max_len)
    out, cache = forward_cached(graphdef, state, cache, pending[:, None], win)
    tok, lp, raw, _ = sample(out.logits[:, 0], sp, key_data, counters)
    router = out.router_indices if capture else None
    return cache, StepOut(tok[:, None], lp[:, None], raw[:, None], active.astype(jnp.int32), router)


def spec_step(graphdef, state, cache: Cache, spec: SpecState, pending, lengths, active,
              sp: SamplerArrays, key_data, counters, *, depth: int, capture: bool):
    """Verifies [pending, drafts] for every active slot (`speculative.accept`: the tokens plain
    decoding samples with the same keys; counters [B] = the index of the next token) and drafts
    again. Returns (cache, spec, StepOut with W = depth + 1, n_new = accepted + 1)."""
    b = pending.shape[0]
    w = depth + 1
    window = jnp.concatenate([pending[:, None], spec.drafts], axis=1)
    win = make_window(lengths, jnp.where(active, w, 0), w, cache.max_len)
    out, cache = forward_cached(graphdef, state, cache, window, win)
    logp = processed_logprobs(out.logits, sp.temperature[:, None], sp.top_k[:, None],
                              sp.top_p[:, None])
    toks = sample_at(logp, key_data, counters[:, None] + jnp.arange(w), all_greedy(sp))
    n_acc = accept(spec.drafts, toks)
    nxt = jnp.concatenate([toks, jnp.zeros((b, depth), jnp.int32)], axis=1)
    d, cache = draft(graphdef, state, cache, depth, out.hidden, nxt, n_acc, lengths, active,
                     sp, key_data, (counters + n_acc + 1)[:, None] + jnp.arange(depth))
    res = StepOut(toks, take(logp, toks), take(raw_logprobs(out.logits), toks),
                  jnp.where(active, n_acc + 1, 0),
                  out.router_indices if capture else None)
    return cache, SpecState(d), res
