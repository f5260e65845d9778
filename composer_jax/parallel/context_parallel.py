"""Context parallelism: load-balanced causal sequence order and per-token field reordering.

With causal attention, splitting a sequence into cp contiguous shards gives shard cp-1 cp times the
work of shard 0. Instead the sequence is cut into 2*cp chunks and shard i holds chunks i and
2*cp-1-i, so every shard holds one early and one late chunk (equal attention work). In the
reordered sequence the new position j holds original token `perm[j]`; sharding that order
contiguously over `context` gives each shard its pair.

Everything per token is computed in the original order first (targets, MTP targets, masks, segment
ids, positions, the MTP future tokens and the global token index used by the causal mask) and then
reordered together (`reorder_batch`); the loss is a sum over tokens, so it needs no un-reorder.
Which fields are per token, and where their token axis is, comes from the batch schema
(`composer_jax.parallel.batch_schema`).

Shape glossary: B batch, T tokens, Dm MTP depth, cp context-parallel degree.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from composer_jax.errors import ConfigError
from composer_jax.parallel.batch_schema import LM_FIELDS, BatchSchema


def load_balance_permutation(t: int, cp: int) -> np.ndarray:
    """perm [T]: new position j holds original token perm[j]; chunks (i, 2cp-1-i) per shard i."""
    if t % (2 * cp):
        raise ConfigError(f"context parallelism: seq_len={t} must be divisible by 2 * context="
                          f"{2 * cp} (load-balanced causal chunks)")
    c = t // (2 * cp)
    chunks = [j for i in range(cp) for j in (i, 2 * cp - 1 - i)]
    return np.concatenate([np.arange(j * c, (j + 1) * c) for j in chunks])


def reorder(x: jnp.ndarray, cp: int, axis: int = -1) -> jnp.ndarray:
    """x with its token axis in load-balanced order."""
    return jnp.take(x, load_balance_permutation(x.shape[axis], cp), axis=axis)


def restore(x: jnp.ndarray, cp: int, axis: int = -1) -> jnp.ndarray:
    """Inverse of `reorder`."""
    return jnp.take(x, np.argsort(load_balance_permutation(x.shape[axis], cp)), axis=axis)


def future_tokens(tokens: jnp.ndarray, depth: int) -> jnp.ndarray:
    """[Dm, B, T]: entry k-1 is tokens shifted left by k (t_{i+k}), zero-padded (MTP inputs)."""
    return jnp.stack([jnp.pad(tokens[:, k:], ((0, 0), (0, k))) for k in range(1, depth + 1)])


def reorder_batch(batch: dict, cp: int, mtp_depth: int = 0,
                  schema: BatchSchema = LM_FIELDS) -> dict:
    """Adds `token_index` [B,T] (and `mtp_tokens` [Dm,B,T] when mtp_depth > 0) computed in the
    original order, then reorders every field the schema declares per token along its token axis
    (fields without a token axis, e.g. [B] advantages, stay as they are). A field the schema does
    not declare is an error that names it."""
    tokens = batch["tokens"]
    b, t = tokens.shape
    out = dict(batch)
    out["token_index"] = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    if "positions" not in out:
        out["positions"] = out["token_index"]
    if "segment_ids" not in out:
        out["segment_ids"] = jnp.ones((b, t), jnp.int32)
    if mtp_depth > 0:
        out["mtp_tokens"] = future_tokens(tokens, mtp_depth)
    if cp == 1:
        return out
    return {k: (reorder(v, cp, axis=schema[k].token_axis) if schema[k].per_token else v)
            for k, v in out.items()}
