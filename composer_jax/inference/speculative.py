"""Speculative decoding with the MTP modules as drafts: drafting and exact rejection sampling.

Drafting (`draft`): MTP module k (k = 1..Dd) at the last verified position takes the previous
depth's hidden state and the embedding of the token k positions ahead — the newly sampled token
for k = 1, the previous draft for k > 1 — and proposes draft k from its head's distribution q_k,
processed with the request's own sampling parameters. Each MTP module keeps its own latent cache
over the verified positions (its entries for positions whose look-ahead token was still a draft
may be approximate; that only changes acceptance, never the output distribution).

Verification (`accept`): the main model scores [pending, d_1..d_Dd] in one pass, giving the target
distributions p_0..p_Dd. Draft i is accepted with probability min(1, p_{i-1}(d_i) / q_i(d_i)); at
the first rejection the replacement is drawn from normalise(max(0, p_{i-1} - q_i)); if all are
accepted a bonus token is drawn from p_Dd. Every emitted token then follows p exactly (Leviathan
et al. 2023; Chen et al. 2023); with greedy parameters p and q are point masses, so the output is
exactly greedy decoding.

Shape glossary: B rows, W window (verified tokens), Dd draft depth, V vocab, D model dim.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from composer_jax.inference.cache import Cache
from composer_jax.inference.forward import make_window, mtp_cached
from composer_jax.inference.sampling import (SamplerArrays, processed_logprobs,
                                             sample_logprobs, take)


@struct.dataclass
class SpecState:
    """Per slot: drafts [B,Dd] int32 and the log-probabilities they were drawn from [B,Dd,V]."""
    drafts: jax.Array
    draft_logq: jax.Array


def init_spec_state(batch: int, depth: int, vocab: int) -> SpecState:
    return SpecState(jnp.zeros((batch, depth), jnp.int32),
                     jnp.zeros((batch, depth, vocab), jnp.float32))


def draft(graphdef, state, cache: Cache, depth: int, hidden, nxt, anchor, starts, active,
          sp: SamplerArrays, keys):
    """Runs MTP modules 0..depth-1 over a window and samples the next drafts.

    hidden [B,W,D]: main-model pre-norm hidden states of the window (positions starts + i);
    nxt [B,W+depth]: nxt[i] = the token at position starts + i + 1 (filled up to `anchor`);
    anchor [B]: window index of the last verified position; active [B] bool; keys [B,depth].
    Returns (drafts [B,depth], draft_logq [B,depth,V], cache with MTP entries written for window
    indices <= anchor).
    """
    b, w = hidden.shape[:2]
    win = make_window(starts, jnp.where(active, anchor + 1, 0), w, cache.max_len)
    rows = jnp.arange(b)
    h, drafts, logqs = hidden, [], []
    for k in range(depth):
        logits, h, cache = mtp_cached(graphdef, state, cache, k, h, nxt[:, k:k + w], win)
        lq = processed_logprobs(logits[rows, anchor], sp.temperature, sp.top_k, sp.top_p)
        d = sample_logprobs(lq, keys[:, k])
        nxt = nxt.at[rows, anchor + k + 1].set(d)
        drafts.append(d)
        logqs.append(lq)
    return jnp.stack(drafts, 1), jnp.stack(logqs, 1), cache


def accept(target_logp, draft_logq, drafts, key_u, key_r):
    """Rejection sampling of drafts against the target.

    target_logp [B,Dd+1,V] (processed p_0..p_Dd), draft_logq [B,Dd,V], drafts [B,Dd], keys [B].
    Returns (n_accepted [B], tokens [B,Dd+1]: the accepted drafts, then the replacement or bonus
    token at index n_accepted; entries after it are meaningless).
    """
    b, dd = drafts.shape
    p_d = jnp.exp(take(target_logp[:, :dd], drafts))
    q_d = jnp.exp(take(draft_logq, drafts))
    u = jax.vmap(lambda k: jax.random.uniform(k, (dd,)))(key_u)
    ok = u * q_d < p_d
    n = jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=1), axis=1)
    p = jnp.exp(target_logp)
    q = jnp.concatenate([jnp.exp(draft_logq), jnp.zeros_like(p[:, :1])], axis=1)
    rows = jnp.arange(b)
    resid = jnp.maximum(p[rows, n] - q[rows, n], 0.0)
    total = resid.sum(-1, keepdims=True)
    resid = jnp.where(total > 0, resid, p[rows, n])
    fix = sample_logprobs(jnp.log(resid), key_r)
    tokens = jnp.concatenate([drafts, jnp.zeros((b, 1), jnp.int32)], axis=1)
    return n, tokens.at[rows, n].set(fix)
