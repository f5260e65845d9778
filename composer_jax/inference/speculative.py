"""Speculative decoding with the MTP modules as drafts: drafting and seed-coupled verification.

Every sampled token of a request is drawn by Gumbel-max from its processed distribution with the
request's key for that token's index, fold_in(key_r, i) (`sampling.keys_at`), in plain and speculative
decoding alike. That fixes what plain decoding emits at index i given the text before it, so
speculation can verify drafts against exactly that token:

Drafting (`draft`): MTP module k (k = 1..Dd) at the last verified position takes the previous
depth's hidden state and the embedding of the token k positions ahead — the newly sampled token
for k = 1, the previous draft for k > 1 — and proposes draft k from its head's distribution q_k,
processed with the request's own sampling parameters, with the key of the token index it
proposes (the same Gumbel noise the target will use there, so a draft head close to the model
proposes the very token the model will sample). Each MTP module keeps its own latent cache over
the verified positions (its entries for positions whose look-ahead token was still a draft may be
approximate; that only changes acceptance, never the output).

Verification (`accept`): the main model scores [pending, d_1..d_Dd] in one pass, giving the target
distributions p_0..p_Dd; target token t_j is the Gumbel-max sample of p_j with the key of its token
index. Drafts are accepted while d_{j+1} == t_j; the first mismatch is replaced by t_j, and if all
match, t_Dd is the bonus token. Every emitted token is therefore the token plain decoding emits
under the same seed — same tokens, same behaviour log-probabilities (exact for sampling and for
greedy, where p and q are point masses) — and the drafts only decide how many come per step.
(Rejection sampling, Leviathan et al. 2023, accepts a little more often when q differs from p, but
its tokens depend on the drafts, so a speculative run would not reproduce a plain one.)

Shape glossary: B rows, W window (verified tokens), Dd draft depth, V vocab, D model dim.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from composer_jax.inference.cache import Cache
from composer_jax.inference.forward import make_window, mtp_cached
from composer_jax.inference.sampling import (SamplerArrays, all_greedy, processed_logprobs,
                                             sample_at)


@struct.dataclass
class SpecState:
    """Per slot: the drafts [B,Dd] int32 to verify at the next step."""
    drafts: jax.Array


def init_spec_state(batch: int, depth: int) -> SpecState:
    return SpecState(jnp.zeros((batch, depth), jnp.int32))


def draft(graphdef, state, cache: Cache, depth: int, hidden, nxt, anchor, starts, active,
          sp: SamplerArrays, key_data, index):
    """Runs MTP modules 0..depth-1 over a window and samples the next drafts.

    hidden [B,W,D]: main-model pre-norm hidden states of the window (positions starts + i);
    nxt [B,W+depth]: nxt[i] = the token at position starts + i + 1 (filled up to `anchor`);
    anchor [B]: window index of the last verified position; active [B] bool; key_data [B,2] and
    index [B,depth]: the requests' keys and the token indices the drafts propose.
    Returns (drafts [B,depth], cache with MTP entries written for window indices <= anchor).
    """
    b, w = hidden.shape[:2]
    win = make_window(starts, jnp.where(active, anchor + 1, 0), w, cache.max_len)
    rows = jnp.arange(b)
    h, drafts = hidden, []
    for k in range(depth):
        logits, h, cache = mtp_cached(graphdef, state, cache, k, h, nxt[:, k:k + w], win)
        lq = processed_logprobs(logits[rows, anchor], sp.temperature, sp.top_k, sp.top_p)
        d = sample_at(lq, key_data, index[:, k], all_greedy(sp))
        nxt = nxt.at[rows, anchor + k + 1].set(d)
        drafts.append(d)
    return jnp.stack(drafts, 1), cache


def accept(drafts, targets):
    """drafts [B,Dd], targets [B,Dd+1] (the tokens plain decoding samples at the window's
    positions) -> n_accepted [B]: the length of the drafts' prefix that equals the targets'.
    The emitted tokens are targets[:, :n_accepted + 1]."""
    ok = drafts == targets[:, :drafts.shape[1]]
    return jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=1), axis=1)
