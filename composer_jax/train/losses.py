"""Pure loss functions of logits and batch fields (no parameters, no modules).

Shape glossary: B batch, T tokens, V vocab, Dm MTP depths, n token chunks.
Each returns a *sum* over valid tokens; callers divide by a token count they choose (the train step
uses the global count of the whole batch, so microbatching gives the same gradients).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


def picked_logit(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """logits[..., targets] of logits [..., V] and int targets [...], as a masked sum over V:
    exact (one non-zero term), an elementwise pass XLA fuses into the logsumexp's, and on a
    vocabulary split over devices a partial sum per shard (a gather along a split vocabulary
    would make GSPMD gather the logits, and its gradient scatters into a [..., V] buffer)."""
    hit = jnp.arange(logits.shape[-1], dtype=jnp.int32) == targets[..., None].astype(jnp.int32)
    return jnp.sum(jnp.where(hit, logits, 0.0), axis=-1)


def cross_entropy_sum(logits: jax.Array, targets: jax.Array, mask: jax.Array) -> jax.Array:
    """sum_{b,t} mask * -log softmax(logits)[targets]. logits [..., V] f32, targets/mask [...]."""
    logz = jax.nn.logsumexp(logits, axis=-1)
    return jnp.sum((logz - picked_logit(logits, targets)) * mask)


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
    return picked_logit(logits, targets) - jax.nn.logsumexp(logits, axis=-1)


def ce_and_z_sums(logits: jax.Array, targets: jax.Array, mask: jax.Array):
    """(sum mask * CE, sum mask * logsumexp^2) of f32 logits [..., V]; one logsumexp for both."""
    logz = jax.nn.logsumexp(logits, axis=-1)
    picked = picked_logit(logits, targets)
    return jnp.sum((logz - picked) * mask), jnp.sum(jnp.square(logz) * mask)


def self_distill_sum(student_logits: jax.Array, teacher_logits: jax.Array,
                     mask: jax.Array) -> jax.Array:
    """sum mask * KL(softmax(stop_gradient(teacher)) || softmax(student)) over [..., V] logits."""
    t = jax.nn.log_softmax(jax.lax.stop_gradient(teacher_logits), axis=-1)
    s = jax.nn.log_softmax(student_logits, axis=-1)
    return jnp.sum(jnp.sum(jnp.exp(t) * (t - s), axis=-1) * mask)


# ---------------------------------------------------------------------------------------------
# Fused LM head + cross-entropy (vocabulary-tiled, gradients computed in the forward)
# ---------------------------------------------------------------------------------------------

# Elements of one [tokens, vocab tile] float32 logits tile (16 MiB): small enough to stay in a
# CPU's cache hierarchy between the matmul that writes it and the reductions that read it.
FUSED_TILE_ELEMENTS = 1 << 22
# Up to this many [tokens, vocab] logits (64 MiB f32) the differentiated head keeps every tile's
# logits from the logsumexp pass for the gradient pass (unrolled over tiles) instead of
# recomputing them (one matmul per tile fewer); larger heads recompute them in a scan.
FUSED_STORE_ELEMENTS = 1 << 24


def vocab_tile(vocab: int, tokens: int, budget: int = FUSED_TILE_ELEMENTS) -> int:
    """The vocabulary tile of `fused_head_ce`: the largest divisor of `vocab` with
    tokens * tile <= budget (at least the smallest divisor >= 128, or all of a small vocab)."""
    cap = max(budget // max(tokens, 1), 128)
    if vocab <= cap:
        return vocab
    divs = [d for d in range(1, cap + 1) if vocab % d == 0]
    best = divs[-1]
    if best >= 128:
        return best
    bigger = [d for d in range(cap + 1, vocab + 1) if vocab % d == 0]
    return bigger[0]


def _tile_logits(hc, w, j, tile, dtype):
    """f32 logits [N, tile] of vocabulary tile j (w [D,V] sliced and cast per tile)."""
    wj = jax.lax.dynamic_slice_in_dim(w, j * tile, tile, axis=1).astype(dtype)
    return jnp.dot(hc, wj, preferred_element_type=jnp.float32), wj


def _lse_and_picked(hc, w, targets, tile, dtype):
    """Online logsumexp over vocabulary tiles and the target logit: ([N] f32, [N] f32)."""
    n = hc.shape[0]
    tiles = w.shape[1] // tile

    def body(carry, j):
        lg, _ = _tile_logits(hc, w, j, tile, dtype)
        return _online_lse_step(carry, lg, targets, j * tile), None

    (m, s, picked), _ = jax.lax.scan(body, _online_lse_init(n), jnp.arange(tiles))
    return m + jnp.log(s), picked


def _online_lse_init(n):
    """(running max, running sum of exp, target logit) before the first tile."""
    return (jnp.full((n,), -jnp.inf, jnp.float32), jnp.zeros((n,), jnp.float32),
            jnp.zeros((n,), jnp.float32))


def _online_lse_step(carry, lg, targets, offset):
    """Merges the logits tile lg [N, tile] (vocabulary columns offset..) into the carry."""
    m, s, picked = carry
    tile = lg.shape[1]
    m_new = jnp.maximum(m, jnp.max(lg, axis=-1))
    s = s * jnp.exp(m - m_new) + jnp.sum(jnp.exp(lg - m_new[:, None]), axis=-1)
    local = targets - offset
    inside = (local >= 0) & (local < tile)
    got = jnp.take_along_axis(lg, jnp.clip(local, 0, tile - 1)[:, None], axis=-1)[:, 0]
    return m_new, s, jnp.where(inside, got, picked)


def _sums(lse, picked, mask):
    return jnp.sum((lse - picked) * mask), jnp.sum(jnp.square(lse) * mask)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _fused_head_ce(h, w, targets, mask, dtype, z_coef, tile):
    lse, picked = _lse_and_picked(h.astype(dtype), w, targets, tile, dtype)
    ce, z = _sums(lse, picked, mask)
    return ce + z_coef * z, (ce, z)


def _dlogits(lg, lse, scale, targets, mask, offset, dtype):
    """d objective / d logits of one tile: mask * (softmax * (1 + 2 z_coef lse) - onehot)."""
    onehot = (jnp.arange(lg.shape[1])[None, :] + offset) == targets[:, None]
    return ((jnp.exp(lg - lse[:, None]) * scale - onehot) * mask[:, None]).astype(dtype)


def _fused_fwd(h, w, targets, mask, dtype, z_coef, tile):
    hc = h.astype(dtype)
    n, d = hc.shape
    # materialised [D, N]: XLA:CPU 0.12 has a fast BF16 x BF16 = F32 kernel for the plain layout,
    # none for a transposed lhs folded into the dot (UNIMPLEMENTED in DotThunk)
    hc_t = jax.lax.optimization_barrier(hc.T)
    tiles = w.shape[1] // tile
    # Small head: the same tiles, unrolled, each tile's logits (and weight slice) kept from the
    # logsumexp pass for the gradient pass (the values the scan below recomputes: bitwise equal).
    kept = [] if n * w.shape[1] <= FUSED_STORE_ELEMENTS else None
    if kept is not None:
        carry = _online_lse_init(n)
        for j in range(tiles):
            lg, wj = _tile_logits(hc, w, j, tile, dtype)
            carry = _online_lse_step(carry, lg, targets, j * tile)
            kept.append((lg, wj))
        m, s, picked = carry
        lse = m + jnp.log(s)
    else:
        lse, picked = _lse_and_picked(hc, w, targets, tile, dtype)
    ce, z = _sums(lse, picked, mask)
    scale = (1.0 + 2.0 * z_coef * lse)[:, None]

    def grads(dh, lg, wj, j):
        """Adds tile j's share to dh; returns (dh, the tile's weight-gradient columns)."""
        dl = _dlogits(lg, lse, scale, targets, mask, j * tile, dtype)
        dh = dh + jnp.dot(dl, wj.T, preferred_element_type=jnp.float32)
        return dh, jnp.dot(hc_t, dl, preferred_element_type=jnp.float32)

    dh = jnp.zeros((n, d), jnp.float32)
    if kept is not None:
        dws = []
        for j, (lg, wj) in enumerate(kept):
            dh, dwj = grads(dh, lg, wj, j)
            dws.append(dwj)
        dw = jnp.concatenate(dws, axis=1)
    else:
        def body(carry, j):
            dh, dw = carry
            dh, dwj = grads(dh, *_tile_logits(hc, w, j, tile, dtype), j)
            return (dh, jax.lax.dynamic_update_slice_in_dim(dw, dwj, j * tile, axis=1)), None

        (dh, dw), _ = jax.lax.scan(body, (dh, jnp.zeros(w.shape, jnp.float32)), jnp.arange(tiles))
    # dtypes travel as empty arrays (residuals must be arrays)
    return (ce + z_coef * z, (ce, z)), (dh, dw, jnp.zeros((0,), h.dtype),
                                        jnp.zeros((0,), w.dtype), targets, mask)


def _fused_bwd(dtype, z_coef, tile, res, g):
    dh, dw, h_like, w_like, targets, mask = res
    g = g[0]       # the (ce, z) outputs are stop-gradient metrics (see fused_head_ce)
    return ((g * dh).astype(h_like.dtype), (g * dw).astype(w_like.dtype),
            np.zeros(targets.shape, jax.dtypes.float0), jnp.zeros_like(mask))


_fused_head_ce.defvjp(_fused_fwd, _fused_bwd)


def fused_head_ce(h: jax.Array, w: jax.Array, targets: jax.Array, mask: jax.Array, *,
                  compute_dtype, z_coef: float = 0.0, tile: int | None = None):
    """(objective, ce_sum, z_sum) of the LM head h @ w, without [N, V] logits in memory.

    h [..., D] normed hidden, w [D, V] head, targets/mask [...]; the matmuls run in
    `compute_dtype` with float32 accumulation (as `lm_logits`). ce_sum = sum mask * CE, z_sum =
    sum mask * logsumexp^2, objective = ce_sum + z_coef * z_sum (z_coef static). The vocabulary
    runs in tiles of `tile` columns (default `vocab_tile`): the forward keeps an online
    logsumexp; under differentiation the forward also computes d objective / d(h, w) tile by
    tile (one recomputed logits tile, then its two gradient matmuls) and the backward only
    scales them, so no [N, V] array, softmax or logits residual ever exists. Only `objective`
    carries gradients; ce_sum and z_sum come out through stop_gradient. Equal to
    `ce_and_z_sums(lm_logits(h, w))` up to float summation order.
    """
    d = h.shape[-1]
    h2 = h.reshape(-1, d)
    tile = tile or vocab_tile(w.shape[1], h2.shape[0])
    if w.shape[1] % tile:
        raise ValueError(f"fused_head_ce: tile {tile} does not divide the vocabulary {w.shape[1]}")
    obj, (ce, z) = _fused_head_ce(h2, w, targets.reshape(-1).astype(jnp.int32),
                                  mask.reshape(-1).astype(jnp.float32), jnp.dtype(compute_dtype),
                                  float(z_coef), int(tile))
    return obj, jax.lax.stop_gradient(ce), jax.lax.stop_gradient(z)
