"""Expert parallelism: MoE dispatch by ragged all-to-all over the `expert` mesh axis.

Inside `jax.shard_map` every device holds its tokens (split over the batch/sequence mesh axes,
which include `expert`) and E/ep experts. Per device:

  1. sort its N*K (token, expert) assignments by expert; the destination shard is expert // E_loc,
     so the sorted list is contiguous per destination;
  2. exchange sizes (all_gather of the [ep] send sizes) to get every offset, then
     `ragged_all_to_all` the token rows and their local expert ids;
  3. sort the received rows by local expert and run the grouped matmuls (`ragged_dot`); with a
     tensor axis each device holds an F/tp slice of every local expert and the partial outputs are
     summed (psum over `tensor`);
  4. the return trip is the mirrored ragged_all_to_all; un-sort and combine with the weights.

Receive buffer bound (dropless): a device can receive at most min(K, E_loc) rows per token of each
of the ep peers, so the buffer holds M = ep * N * min(K, E_loc) rows (N = tokens per device). This
worst case (every peer routing everything to one shard) is what makes dropless dispatch exact; it
costs ep x the average buffer. With `moe_capacity_factor` cf > 0 each source keeps at most
C = ceil(cf * N * K / E) assignments per expert (the earliest in token order), the rest are dropped
(their output is 0; the shared expert still runs) and M = ep * min(N * min(K, E_loc), E_loc * C);
the dropped fraction is returned as a metric.

Shape glossary: B batch, T tokens, N = B*T local tokens, D model dim, F expert width, E experts,
E_loc = E / ep, K experts per token, M receive-buffer rows.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from composer_jax.errors import ConfigError
from composer_jax.parallel.collectives import ragged_all_to_all
from composer_jax.parallel.sharding import ParallelContext, check_batch

EXPERT_AXIS = "expert"


def _exclusive_cumsum(x, axis=0):
    return jnp.cumsum(x, axis=axis) - x


def _inverse(perm):
    return jnp.zeros_like(perm).at[perm].set(jnp.arange(perm.shape[0], dtype=perm.dtype))


def _grouped(x, w, group_sizes, dtype):
    y = jax.lax.ragged_dot(x.astype(dtype), w.astype(dtype), group_sizes,
                           preferred_element_type=jnp.float32)
    return y.astype(dtype)


def capacity_keep(flat: jax.Array, num_experts: int, capacity: int) -> jax.Array:
    """Bool [A]: assignment a (expert flat[a]) is among the first `capacity` of its expert."""
    order = jnp.argsort(flat, stable=True)
    counts = jnp.bincount(flat, length=num_experts)
    rank_sorted = jnp.arange(flat.shape[0]) - _exclusive_cumsum(counts)[flat[order]]
    return (rank_sorted < capacity)[_inverse(order)]


def receive_rows(n_tokens: int, k: int, num_experts: int, ep: int, capacity_factor: float) -> int:
    """Rows M of the worst-case receive buffer (see the module docstring)."""
    e_loc = num_experts // ep
    rows = ep * n_tokens * min(k, e_loc)
    if capacity_factor > 0:
        cap = math.ceil(capacity_factor * n_tokens * k / num_experts)
        rows = min(rows, ep * e_loc * cap)
    return max(rows, 1)


def _local_dispatch(x, idx, weights, w_gate, w_up, w_down, *, dtype, capacity_factor,
                    token_axes, tensor_axes):
    b, t, d = x.shape
    n, k = b * t, idx.shape[-1]
    ep = jax.lax.axis_size(EXPERT_AXIS)
    e_loc = w_gate.shape[0]
    num_experts = e_loc * ep
    x = x.reshape(n, d)
    flat = idx.reshape(n * k).astype(jnp.int32)
    if capacity_factor > 0:
        cap = math.ceil(capacity_factor * n * k / num_experts)
        keep = capacity_keep(flat, num_experts, cap)
        flat = jnp.where(keep, flat, num_experts)                 # dropped -> sentinel, sorts last
    else:
        keep = jnp.ones_like(flat, bool)
    order = jnp.argsort(flat, stable=True)
    sorted_e = flat[order]
    send_sizes = jnp.bincount(sorted_e // e_loc, length=ep).astype(jnp.int32)   # sentinel dropped
    in_off = _exclusive_cumsum(send_sizes)
    all_sizes = jax.lax.all_gather(send_sizes, EXPERT_AXIS)                      # [src, dst]
    all_in_off = jax.lax.all_gather(in_off, EXPERT_AXIS)
    me = jax.lax.axis_index(EXPERT_AXIS)
    recv_sizes = all_sizes[:, me]
    out_off = _exclusive_cumsum(all_sizes, axis=0)[me]           # my slot in each receiver's buffer
    recv_off = _exclusive_cumsum(recv_sizes)
    rows = receive_rows(n, k, num_experts, ep, capacity_factor)
    per_peer = rows // ep            # bound on one send in either direction

    xs = x[order // k]                                                           # [N*K, D]
    buf = ragged_all_to_all(xs, jnp.zeros((rows, d), xs.dtype), in_off, send_sizes, out_off,
                            recv_sizes, axis_name=EXPERT_AXIS, max_send_rows=per_peer)
    ids = ragged_all_to_all((sorted_e % e_loc).astype(jnp.int32),
                            jnp.full((rows,), e_loc, jnp.int32), in_off, send_sizes, out_off,
                            recv_sizes, axis_name=EXPERT_AXIS, max_send_rows=per_peer)
    local_order = jnp.argsort(ids, stable=True)
    group_sizes = jnp.bincount(ids, length=e_loc).astype(jnp.int32)             # padding excluded
    xr = buf[local_order]
    h = jax.nn.silu(_grouped(xr, w_gate, group_sizes, dtype)) * _grouped(xr, w_up, group_sizes, dtype)
    yr = _grouped(h, w_down, group_sizes, dtype)                                 # [M, D]
    if tensor_axes:
        yr = jax.lax.psum(yr, tensor_axes)
    y_buf = yr[_inverse(local_order)]
    back = ragged_all_to_all(y_buf, jnp.zeros((n * k, d), y_buf.dtype), recv_off, recv_sizes,
                             all_in_off[:, me], send_sizes, axis_name=EXPERT_AXIS,
                             max_send_rows=per_peer)
    y = back[_inverse(order)].reshape(n, k, d)
    w = weights.reshape(n, k) * keep.reshape(n, k)
    out = jnp.einsum("nkd,nk->nd", y.astype(jnp.float32), w).astype(x.dtype).reshape(b, t, d)
    dropped = jax.lax.psum(jnp.sum(~keep).astype(jnp.float32), token_axes)
    total = jax.lax.psum(jnp.float32(n * k), token_axes)
    return out, dropped / total


def dispatch_expert_parallel(x, idx, weights, w_gate, w_up, w_down, dtype, pc: ParallelContext,
                             capacity_factor: float = 0.0):
    """Expert-parallel MoE. x [B,T,D], idx/weights [B,T,K], w_gate/w_up [E,D,F], w_down [E,F,D]
    (global arrays) -> (y [B,T,D], dropped fraction [] f32). Dropless when capacity_factor == 0."""
    batch_axes, seq_axes = pc.axes_of("batch"), pc.axes_of("seq")
    token_axes = batch_axes + seq_axes
    if EXPERT_AXIS not in token_axes:
        raise ConfigError(f"expert parallelism needs tokens split over the expert axis; rules "
                          f"{pc.rules.name!r} split batch over {batch_axes}, seq over {seq_axes}")
    check_batch(x.shape[:2], pc, what="MoE tokens")
    ep = pc.size(EXPERT_AXIS)
    e = w_gate.shape[0]
    if e % ep:
        raise ConfigError(f"num_routed_experts={e} is not divisible by mesh axis expert={ep}")
    tensor_axes = tuple(a for a in pc.axes_of("expert_mlp") if a != EXPERT_AXIS)
    if w_gate.shape[-1] % pc.size(*tensor_axes):
        raise ConfigError(f"moe_intermediate_size={w_gate.shape[-1]} is not divisible by mesh axes "
                          f"{ {a: pc.sizes[a] for a in tensor_axes} }")
    tp = tensor_axes or None
    tok = P(batch_axes or None, seq_axes or None, None)
    fn = jax.shard_map(
        lambda *a: _local_dispatch(*a, dtype=dtype, capacity_factor=capacity_factor,
                                   token_axes=token_axes, tensor_axes=tensor_axes),
        in_specs=(tok, tok, tok, P(EXPERT_AXIS, None, tp), P(EXPERT_AXIS, None, tp),
                  P(EXPERT_AXIS, tp, None)),
        out_specs=(tok, P()))
    return fn(x, idx, weights, w_gate, w_up, w_down)
