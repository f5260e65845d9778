"""Per-token computations on each device's own tokens: `per_token(fn, tokens, shared)`.

A function of one token at a time (a router: matmul, scores, top-k, weights) needs no data from
other devices, but traced on global arrays it is left to XLA's SPMD partitioner, which does not
split every op along tokens (a TopK over the expert dim, for one, gets its [N, E] operand
all-gathered). `per_token` runs such a function inside `jax.shard_map` over the mesh axes that
split the token dims (the rules' `batch` and `seq` axes), with the small shared operands
(parameters) replicated, so nothing per token crosses devices. Token sums the function returns
(e.g. expert loads) are psum-ed over those axes, so they are global sums.

Without an active ParallelContext, with no token axis of size > 1, or inside a `shard_map` over
other mesh axes, `fn` is called as it is (without a context: bitwise the single-device program);
inside a `shard_map` whose manual axes include a token axis it raises (the tokens are already
local there, and sums would silently stay per shard).

Shape glossary: B batch, T tokens per sequence (the token dims of every `tokens` leaf).
"""
from __future__ import annotations

from typing import Callable

import jax
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

from composer_jax.errors import ConfigError
from composer_jax.parallel.sharding import (ParallelContext, check_batch, constrain, current,
                                            gathered)


def token_axes(pc: ParallelContext) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(mesh axes of size > 1 splitting the batch dim, those splitting the sequence dim)."""
    return pc.axes_of("batch"), pc.axes_of("seq")


def token_spec(pc: ParallelContext) -> P:
    """PartitionSpec prefix of a [B, T, ...] per-token array (trailing dims unsplit)."""
    batch, seq = token_axes(pc)
    return P(batch or None, seq or None)


def _manual_axes() -> set[str]:
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return set()
    return {a for a, k in zip(mesh.axis_names, mesh.axis_types) if k == AxisType.Manual}


def per_token(fn: Callable, tokens, shared=()):
    """Runs `fn(tokens, shared) -> (local, sums)` on each device's tokens; returns (local, sums).

    tokens: pytree of arrays [B, T, ...] (global; split over the token mesh axes).
    shared: pytree of arrays every device needs whole (small parameters); replicated. Their
      gradients are summed over the token shards by shard_map's transpose.
    local:  pytree of per-token outputs [B, T, ...], returned split like `tokens`.
    sums:   pytree of per-device sums over tokens, returned summed over all token shards (global).

    `fn` must treat tokens independently (apart from what it puts in `sums`).
    """
    pc = current()
    if pc is None:
        return fn(tokens, shared)
    batch, seq = token_axes(pc)
    axes = batch + seq
    manual = _manual_axes()
    if not axes or manual:
        if manual & set(axes):
            raise ConfigError(f"per_token: token mesh axes {axes} are already manual "
                              f"({sorted(manual)}); call it outside jax.shard_map")
        return fn(tokens, shared)
    for leaf in jax.tree.leaves(tokens):
        if leaf.ndim < 2:
            raise ConfigError(f"per_token: token arrays must be [B, T, ...]; got {leaf.shape}")
        check_batch(leaf.shape[:2], pc, what="per-token input")
    spec = token_spec(pc)
    tokens = jax.tree.map(lambda a: constrain(a, spec), tokens)
    # replicated copies of parameters: tagged like gathered weights (not saved under remat none)
    shared = jax.tree.map(lambda a: gathered(a, P()), shared)

    def local(tok, sh):
        out, sums = fn(tok, sh)
        return out, jax.tree.map(lambda s: jax.lax.psum(s, axes), sums)

    return jax.shard_map(local, in_specs=(spec, P()), out_specs=(spec, P()))(tokens, shared)


__all__ = ["per_token", "token_axes", "token_spec"]
