"""Pure loss functions of logits and batch fields (no parameters, no modules).

Shape glossary: B batch, T tokens, V vocab, Dm MTP depths, n token chunks.
Each returns a *sum* over valid tokens; callers divide by a token count they choose (the train step
uses the global count of the whole batch, so microbatching gives the same gradients).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def cross_entropy_sum(logits: jax.Array, targets: jax.Array, mask: jax.Array) -> jax.Array:
    """sum_{b,t} mask * -log softmax(logits)[targets]. logits [..., V] f32, targets/mask [...]."""
    logz = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return jnp.sum((logz - picked) * mask)


def z_loss_sum(logits: jax.Array, mask: jax.Array) -> jax.Array:
    """sum mask * logsumexp(logits)^2 (PaLM's z-loss, keeps the softmax normaliser near 1)."""
    return jnp.sum(jnp.square(jax.nn.logsumexp(logits, axis=-1)) * mask)


def shift_left(x: jax.Array, k: int, axis: int = 1) -> jax.Array:
    """x[:, i + k] at position i (zero-filled past the end) along `axis`."""
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, k)
    return jnp.pad(jax.lax.slice_in_dim(x, k, x.shape[axis], axis=axis), pad)


def mtp_self_distill_sums(mtp_logits: jax.Array, main_logits: jax.Array, mtp_mask: jax.Array):
    """Per-depth KL(p_main || q_mtp) sums [Dm] (the Composer recipe's MTP self-distillation).

    MTP depth k at position i predicts token i+k+1, which the main head predicts at position i+k;
    the teacher is stop_gradient(softmax(main_logits[:, i+k])). mtp_logits [Dm,B,T,V],
    main_logits [B,T,V], mtp_mask [B,Dm,T] (1 where i+k+1 lies in i's document).
    """
    teacher_logp = jax.nn.log_softmax(jax.lax.stop_gradient(main_logits), axis=-1)
    sums = []
    for d in range(mtp_logits.shape[0]):
        t = shift_left(teacher_logp, d + 1)
        s = jax.nn.log_softmax(mtp_logits[d], axis=-1)
        kl = jnp.sum(jnp.exp(t) * (t - s), axis=-1)
        sums.append(jnp.sum(kl * mtp_mask[:, d]))
    return jnp.stack(sums)


# ---------------------------------------------------------------------------------------------
# Token-chunked losses: the [..., V] logits never exist for all tokens at once
# ---------------------------------------------------------------------------------------------


def token_chunks(x: jax.Array, n: int) -> jax.Array:
    """x [B, T, ...] -> [n, B, T/n, ...]; chunk j holds tokens j, j+n, j+2n, ... (strided, so an
    array whose token axis is split over devices stays split the same way in every chunk)."""
    b, t = x.shape[:2]
    if t % n:
        raise ValueError(f"token_chunks: {t} tokens do not split into {n} chunks")
    return jnp.moveaxis(x.reshape((b, t // n, n) + x.shape[2:]), 2, 0)


def sum_over_token_chunks(fn, n_chunks: int, chunked: tuple, shared: tuple = ()):
    """sum over j of fn(*chunk_j(chunked), *shared), a pytree of sums.

    chunked: arrays [B, T, ...] split by `token_chunks`; shared: arrays every chunk sees whole
    (weights). With n_chunks > 1 the chunks run in a `lax.scan` whose body is checkpointed, so
    forward and backward each hold one chunk's intermediates (e.g. [B, T/n, V] logits) at a time;
    the sums equal the unchunked ones up to float summation order. n_chunks == 1 is fn itself.
    """
    if n_chunks == 1:
        return fn(*chunked, *shared)
    xs = tuple(token_chunks(a, n_chunks) for a in chunked)
    body = jax.checkpoint(lambda xs_j, sh: fn(*xs_j, *sh))
    first = tuple(x[0] for x in xs)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(body, first, shared))

    def step(acc, xs_j):
        return jax.tree.map(jnp.add, acc, body(xs_j, shared)), None

    acc, _ = jax.lax.scan(step, zeros, xs)
    return acc


def untoken_chunks(x: jax.Array) -> jax.Array:
    """Inverse of `token_chunks`: [n, B, T/n, ...] -> [B, T, ...]."""
    n, b, c = x.shape[:3]
    return jnp.moveaxis(x, 0, 2).reshape((b, c * n) + x.shape[3:])


def map_over_token_chunks(fn, n_chunks: int, chunked: tuple, shared: tuple = ()):
    """fn(*chunk_j(chunked), *shared) for every chunk j, reassembled into per-token outputs
    [B, T, ...] (a pytree). Like `sum_over_token_chunks`, the chunks run in a `lax.scan` with a
    checkpointed body, so one chunk's [B, T/n, V] logits exist at a time. n_chunks == 1 is fn."""
    if n_chunks == 1:
        return fn(*chunked, *shared)
    xs = tuple(token_chunks(a, n_chunks) for a in chunked)
    body = jax.checkpoint(lambda xs_j, sh: fn(*xs_j, *sh))
    _, ys = jax.lax.scan(lambda c, xs_j: (c, body(xs_j, shared)), None, xs)
    return jax.tree.map(untoken_chunks, ys)


def target_logprobs(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """log softmax(logits)[targets] of f32 logits [..., V] and int targets [...] -> [...]."""
    logz = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return picked - logz


def ce_and_z_sums(logits: jax.Array, targets: jax.Array, mask: jax.Array):
    """(sum mask * CE, sum mask * logsumexp^2) of f32 logits [..., V]; one logsumexp for both."""
    logz = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return jnp.sum((logz - picked) * mask), jnp.sum(jnp.square(logz) * mask)


def self_distill_sum(student_logits: jax.Array, teacher_logits: jax.Array,
                     mask: jax.Array) -> jax.Array:
    """sum mask * KL(softmax(stop_gradient(teacher)) || softmax(student)) over [..., V] logits."""
    t = jax.nn.log_softmax(jax.lax.stop_gradient(teacher_logits), axis=-1)
    s = jax.nn.log_softmax(student_logits, axis=-1)
    return jnp.sum(jnp.sum(jnp.exp(t) * (t - s), axis=-1) * mask)
