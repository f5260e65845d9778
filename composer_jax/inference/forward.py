"""Cached forward passes of the main model and of the MTP modules, as pure functions.

They consume the same parameter pytree as `Transformer` (`graphdef, state = nnx.split(model)`),
drive the stacked layers with the training forward's own driver (`transformer.drive_layers`: the
same per-layer precision, e.g. `quant_bf16_last_blocks`) and the same MTP input and precision
(`transformer.mtp_input`, `mtp_ctx`), and reuse the model's own modules (norms, q/latent
projections, FFN/MoE weights and routing) on each layer slice; attention differs (it reads and
writes the latent cache, `inference.mla`) and so does the MoE dispatch of few-token windows
(`inference.moe`). One function serves prefill (T = prompt chunk), decode
(T = 1) and speculative verification (T = 1 + drafts): new token t of row b sits at sequence
position starts[b] + t and is real when t < n_valid[b] (padding is computed but never written).

Shape glossary: B batch, T new tokens, S cache length, D model dim, V vocab, K experts per token,
Lm MoE layers, Dm MTP depth.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx, struct

from composer_jax.model.layers import Ctx
from composer_jax.model.transformer import (Transformer, drive_layers, mtp_ctx, mtp_input,
                                            unroll_layer_scans)
from composer_jax.inference.cache import Cache, LayerCache
from composer_jax.inference.mla import mla_cached
from composer_jax.inference.moe import moe_cached


@struct.dataclass
class Window:
    """Where new tokens go. positions [B,T]; write_pos [B,T] (>= S for padding); valid [B,T]."""
    positions: jax.Array
    write_pos: jax.Array
    valid: jax.Array


def make_window(starts: jax.Array, n_valid: jax.Array, t: int, max_len: int) -> Window:
    """starts [B], n_valid [B] -> the Window of T new tokens per row."""
    offs = jnp.arange(t, dtype=jnp.int32)[None, :]
    positions = starts.astype(jnp.int32)[:, None] + offs
    valid = offs < n_valid[:, None]
    return Window(positions, jnp.where(valid, positions, max_len), valid)


@struct.dataclass
class ForwardOut:
    """logits [B,T,V] f32; hidden [B,T,D] (pre-final-norm, the MTP input);
    router_indices [Lm,B,T,K] int32 or None (no MoE layers)."""
    logits: jax.Array
    hidden: jax.Array
    router_indices: jax.Array | None


def block_cached(blk, x, win: Window, c_cache, kpe_cache, ctx: Ctx, replay=None,
                 absorbed: bool = True):
    """One `Block` (a layer slice) with a cache -> (x, c_cache, kpe_cache, router idx or None)."""
    attn_out, c_cache, kpe_cache = mla_cached(blk.attn, blk.attn_norm(x), win.positions,
                                              win.write_pos, c_cache, kpe_cache, ctx, absorbed)
    x = x + attn_out
    h = blk.ffn_norm(x)
    if blk.is_moe:
        y, idx = moe_cached(blk.ffn, h, win.valid.astype(jnp.int32), ctx, replay)
    else:
        y, idx = blk.ffn(h, ctx), None
    return x + y, c_cache, kpe_cache, idx


def scan_blocks_cached(blocks, x, win: Window, cache: LayerCache, ctx: Ctx, replay=None,
                       absorbed: bool = True, first_layer: int = 0):
    """A stack of L blocks over new tokens. replay [L,B,T,K] or None; first_layer: the stack's
    first global layer index (per-layer precision) -> (x, new LayerCache, router idx [L,B,T,K] or
    None)."""
    def layer(block, h, c, xs):
        lc, kpe, rep = xs
        h, lc, kpe, idx = block_cached(block, h, win, lc, kpe, c, rep, absorbed)
        return h, (lc, kpe, idx)

    x, (c, kpe, idx) = drive_layers(blocks, x, ctx, layer, (cache.c, cache.k_pe, replay),
                                    first_layer, unroll=unroll_layer_scans())
    return x, LayerCache(c, kpe), idx


def forward_cached(graphdef, state, cache: Cache, tokens: jax.Array, win: Window,
                   router_replay=None, absorbed: bool = True) -> tuple[ForwardOut, Cache]:
    """The main model over new tokens [B,T] placed by `win`, reading and extending `cache`.

    router_replay [Lm,B,T,K]: expert indices to reuse. Returns (ForwardOut, updated cache); the
    MTP part of the cache is untouched (see `mtp_cached`).
    """
    model: Transformer = nnx.merge(graphdef, state)
    ctx = model.forward_ctx()
    x = model.embed_tokens(tokens, ctx)
    dense, moe, idx = cache.dense, cache.moe, None
    if model.dense_layers is not None:
        x, dense, _ = scan_blocks_cached(model.dense_layers, x, win, cache.dense, ctx, None,
                                         absorbed)
    if model.moe_layers is not None:
        x, moe, idx = scan_blocks_cached(model.moe_layers, x, win, cache.moe, ctx, router_replay,
                                         absorbed, first_layer=model.cfg.first_k_dense)
    logits = model.head(model.final_norm(x), ctx)
    return ForwardOut(logits, x, idx), cache.replace(dense=dense, moe=moe)


def mtp_cached(graphdef, state, cache: Cache, depth: int, h_prev: jax.Array,
               next_tokens: jax.Array, win: Window, absorbed: bool = True):
    """MTP module `depth` (0-based) over the window.

    h_prev [B,T,D]: the previous depth's hidden (depth 0: the main model's pre-norm hidden);
    next_tokens [B,T]: the token depth+1 positions ahead of each window position.
    Returns (logits [B,T,V] f32, hidden [B,T,D] for the next depth, updated cache).
    """
    model: Transformer = nnx.merge(graphdef, state)
    ctx = mtp_ctx(model.forward_ctx())
    mgd, mstate = nnx.split(model.mtp)
    m = nnx.merge(mgd, jax.tree.map(lambda a: a[depth], mstate))
    emb = model.embed_tokens(next_tokens, ctx)
    x = mtp_input(m, emb, h_prev, ctx)
    lc = cache.mtp
    x, c, kpe, _ = block_cached(m.block, x, win, lc.c[depth], lc.k_pe[depth], ctx, None, absorbed)
    logits = model.head(m.norm(x), ctx)
    mtp = LayerCache(lc.c.at[depth].set(c), lc.k_pe.at[depth].set(kpe))
    return logits, x, cache.replace(mtp=mtp)
