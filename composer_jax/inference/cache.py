"""The MLA latent KV cache: per layer, the normalised latent c and the rope'd shared key k_pe.

For the Kimi K2.5 / DeepSeek-V3 configs that is kv_lora_rank + qk_rope_head_dim = 512 + 64 = 576
values per token per layer, instead of H * (qk_head_dim + v_head_dim) for a plain KV cache.
A cache row (batch index) is a *slot*; a slot's tokens occupy cache positions 0..len-1, and the
token at sequence position p is stored at cache position p. Positions past a slot's length hold
stale values that are never attended to (queries only see positions <= their own).

Shape glossary: L stacked layers, B slots, S cache length (context), C kv_lora rank, R rope dims,
T new tokens.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from composer_jax.config import ModelConfig
from composer_jax.model.layers import dtype_of


@struct.dataclass
class LayerCache:
    """c [L,B,S,C] and k_pe [L,B,S,R] of one stack of layers (leading axis = layer)."""
    c: jax.Array
    k_pe: jax.Array


@struct.dataclass
class Cache:
    """Caches of the dense stack, the MoE stack and the MTP stack (None where absent)."""
    dense: LayerCache | None
    moe: LayerCache | None
    mtp: LayerCache | None

    @property
    def max_len(self) -> int:
        return next(x for x in (self.dense, self.moe, self.mtp) if x is not None).c.shape[2]


def _stack(cfg: ModelConfig, layers: int, batch: int, max_len: int, dtype) -> LayerCache | None:
    if layers == 0:
        return None
    dt = dtype_of(dtype)
    return LayerCache(c=jnp.zeros((layers, batch, max_len, cfg.kv_lora_rank), dt),
                      k_pe=jnp.zeros((layers, batch, max_len, cfg.qk_rope_head_dim), dt))


def init_cache(cfg: ModelConfig, batch: int, max_len: int, with_mtp: bool = False,
               dtype="float32") -> Cache:
    """A zero cache for `batch` slots of `max_len` positions (MTP stack only if `with_mtp`),
    in `dtype` (the model's execution.compute_dtype)."""
    return Cache(dense=_stack(cfg, cfg.first_k_dense, batch, max_len, dtype),
                 moe=_stack(cfg, cfg.num_moe_layers, batch, max_len, dtype),
                 mtp=_stack(cfg, cfg.mtp_depth if with_mtp else 0, batch, max_len, dtype))


def cache_bytes_per_token(cfg: ModelConfig, with_mtp: bool = False, dtype="float32") -> int:
    """Bytes one token occupies in the cache over all layers (cached in `dtype`, the model's
    execution.compute_dtype)."""
    layers = cfg.num_layers + (cfg.mtp_depth if with_mtp else 0)
    return layers * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * dtype_of(dtype).itemsize


def write_layer(c_cache: jax.Array, kpe_cache: jax.Array, c: jax.Array, k_pe: jax.Array,
                write_pos: jax.Array):
    """Writes new entries of one layer. c_cache [B,S,C], kpe_cache [B,S,R], c [B,T,C],
    k_pe [B,T,R], write_pos [B,T] (a position >= S drops the entry: padding)."""
    rows = jnp.broadcast_to(jnp.arange(c.shape[0])[:, None], write_pos.shape)
    c_cache = c_cache.at[rows, write_pos].set(c.astype(c_cache.dtype), mode="drop")
    kpe_cache = kpe_cache.at[rows, write_pos].set(k_pe.astype(kpe_cache.dtype), mode="drop")
    return c_cache, kpe_cache


def gather_slots(cache: Cache, slots: jax.Array) -> Cache:
    """The sub-cache of slots [n] (batch axis 1)."""
    return jax.tree.map(lambda a: a[:, slots], cache)


def scatter_slots(cache: Cache, slots: jax.Array, sub: Cache) -> Cache:
    """Writes the sub-cache `sub` back into slots [n]."""
    return jax.tree.map(lambda a, s: a.at[:, slots].set(s), cache, sub)
