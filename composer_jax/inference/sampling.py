"""Sampling: temperature, top-k, top-p and greedy, with per-row parameters and explicit keys.

`processed_logprobs` gives the log of the distribution actually sampled from (greedy = a point
mass at the argmax, log-probability 0 there and -inf elsewhere); `raw_logprobs` the model's own
distribution at temperature 1. Both are returned for every sampled token: RL needs the behaviour
log-probability (processed) and the model log-probability (raw).

Shape glossary: B rows, V vocab, ... any leading dims.
"""
from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from composer_jax.errors import ConfigError  # noqa: F401
from composer_jax.protocol.params import SamplingParams  # noqa: F401  (JAX-free; re-exported)


@struct.dataclass
class SamplerArrays:
    """Per-row sampling parameters as arrays: temperature [B] f32, top_k [B] i32, top_p [B] f32,
    forced [B] i32 (the token to emit instead of sampling, -1 = sample)."""
    temperature: jax.Array
    top_k: jax.Array
    top_p: jax.Array
    forced: jax.Array

    @staticmethod
    def build(params: list[SamplingParams], forced=None) -> "SamplerArrays":
        """From per-row params; forced: per-row token to force (-1 or None = sample). The fields
        are host (numpy) arrays: a jitted step takes them as arguments without the per-array
        eager dispatch that `jnp.asarray` costs on every decode step."""
        forced = [-1] * len(params) if forced is None else [-1 if f is None else f for f in forced]
        return SamplerArrays(np.asarray([p.temperature for p in params], np.float32),
                             np.asarray([p.top_k for p in params], np.int32),
                             np.asarray([p.top_p for p in params], np.float32),
                             np.asarray(forced, np.int32))


def raw_logprobs(logits: jax.Array) -> jax.Array:
    return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)


def processed_logprobs(logits: jax.Array, temperature: jax.Array, top_k: jax.Array,
                       top_p: jax.Array) -> jax.Array:
    """Log of the sampling distribution [..., V]. logits [..., V]; parameters [...] broadcast
    against the leading dims. Tokens outside the top-k / top-p set get -inf (ties at the
    threshold are kept). The vocabulary sort that top-k / top-p need runs only when some row
    uses them (a runtime branch: greedy and plain-temperature batches skip it)."""
    logits = logits.astype(jnp.float32)
    t = jnp.broadcast_to(temperature, logits.shape[:-1])
    k = jnp.broadcast_to(top_k, logits.shape[:-1])
    p = jnp.broadcast_to(top_p, logits.shape[:-1])
    filtered = jnp.any((t > 0) & ((k > 0) | (p < 1)))
    return jax.lax.cond(filtered, _filtered_logprobs, _unfiltered_logprobs, logits, t, k, p)


def _unfiltered_logprobs(logits, temperature, top_k, top_p):
    """`processed_logprobs` when no row filters: greedy point masses, else log_softmax(l / T)."""
    del top_k, top_p
    v = logits.shape[-1]
    t = temperature[..., None]
    greedy = t <= 0
    logp = jax.nn.log_softmax(logits / jnp.where(greedy, 1.0, t), axis=-1)
    point = jnp.where(jnp.arange(v) == jnp.argmax(logits, axis=-1)[..., None], 0.0, -jnp.inf)
    return jnp.where(greedy, point, logp)


def _filtered_logprobs(logits, temperature, top_k, top_p):
    v = logits.shape[-1]
    t = temperature[..., None]
    greedy = t <= 0
    scaled = logits / jnp.where(greedy, 1.0, t)
    desc = -jnp.sort(-scaled, axis=-1)
    k = jnp.where(top_k > 0, jnp.minimum(top_k, v), v)[..., None]
    kth = jnp.take_along_axis(desc, k - 1, axis=-1)
    scaled = jnp.where(scaled >= kth, scaled, -jnp.inf)
    desc = jnp.where(jnp.arange(v) < k, desc, -jnp.inf)
    probs = jax.nn.softmax(desc, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs                 # mass strictly above each token
    keep = jnp.sum(before < top_p[..., None], axis=-1, keepdims=True)   # >= 1
    pth = jnp.take_along_axis(desc, keep - 1, axis=-1)
    scaled = jnp.where(scaled >= pth, scaled, -jnp.inf)
    logp = jax.nn.log_softmax(scaled, axis=-1)
    point = jnp.where(jnp.arange(v) == jnp.argmax(logits, axis=-1)[..., None], 0.0, -jnp.inf)
    return jnp.where(greedy, point, logp)


def sample_logprobs(logp: jax.Array, keys: jax.Array) -> jax.Array:
    """One token per row from log-probabilities logp [B,V] with keys [B] -> int32 [B]."""
    return jax.vmap(lambda k, l: jax.random.categorical(k, l))(keys, logp).astype(jnp.int32)


def keys_at(key_data, index):
    """Per-request keys for token indices: key_data [B,2] uint32, index [B,...] int32 ->
    keys [B,...] = fold_in(key_b, index) (the key that samples token `index` of request b)."""
    keys = jax.random.wrap_key_data(key_data)
    return jax.vmap(lambda k, i: jax.vmap(lambda j: jax.random.fold_in(k, j))(i.reshape(-1))
                    .reshape(i.shape))(keys, index)


def gumbel_sample(logp, keys):
    """Gumbel-max samples: logp [B,...,V], keys [B,...] -> int32 [B,...] (what
    `sample_logprobs` draws for the same key)."""
    flat = sample_logprobs(logp.reshape(-1, logp.shape[-1]), keys.reshape(-1))
    return flat.reshape(keys.shape)


def sample_at(logp, key_data, index, greedy):
    """Tokens [B,...] int32 from logp [B,...,V]: `gumbel_sample(logp, keys_at(key_data, index))`.

    greedy: a scalar bool, true when every row is greedy (temperature 0, so every distribution
    is a point mass): then the argmax, which is the very token Gumbel-max picks from a point mass,
    without deriving keys or drawing noise (on CPU the threefry rounds run as loops of small
    kernels: a fifth of a batch-1 decode step). A runtime branch, so one compiled step serves both.
    """
    return jax.lax.cond(greedy, lambda: jnp.argmax(logp, axis=-1).astype(jnp.int32),
                        lambda: gumbel_sample(logp, keys_at(key_data, index)))


def all_greedy(sp: SamplerArrays):
    """True when every row samples greedily (see `sample_at`)."""
    return jnp.all(sp.temperature <= 0)


def take(logp: jax.Array, tokens: jax.Array) -> jax.Array:
    """logp [..., V] at tokens [...] -> [...]."""
    return jnp.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0]


def sample(logits: jax.Array, sp: SamplerArrays, key_data: jax.Array, index: jax.Array):
    """logits [B,V] -> (tokens [B] int32, logprob under the sampled distribution [B],
    logprob under the raw model [B], processed logprobs [B,V]). Row b's token is drawn with its
    request's key data key_data[b] for token index index[b] (`sample_at`). Rows with
    sp.forced >= 0 emit that token (teacher forcing) and report its log-probabilities."""
    logp = processed_logprobs(logits, sp.temperature, sp.top_k, sp.top_p)
    tokens = sample_at(logp, key_data, index, all_greedy(sp))
    tokens = jnp.where(sp.forced >= 0, sp.forced, tokens)
    return tokens, take(logp, tokens), take(raw_logprobs(logits), tokens), logp
