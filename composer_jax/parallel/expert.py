"""Expert parallelism: MoE dispatch by ragged all-to-all over the `expert` mesh axis.

Inside `jax.shard_map` every device holds its tokens (split over the batch/sequence mesh axes,
which include `expert`) and E/ep experts. Per device:

  1. sort its N*K (token, expert) assignments by expert; the destination shard is expert // E_loc,
     so the sorted list is contiguous per destination;
  2. exchange sizes (all_gather of the [ep] send sizes) to get every offset, then
     `ragged_all_to_all` the token rows and their local expert ids (the rows optionally encoded
     by a `RowCodec`, e.g. MXFP8 bytes instead of bf16: DeepSeek-V3-style FP8 dispatch);
  3. sort the received rows by local expert and run the grouped matmuls (`ragged_dot` in the
     compute dtype, or the caller's `grouped`, e.g. the model's MXFP8/NVFP4 quantized ragged dot);
     with a tensor axis each device holds an F/tp slice of every local expert and the partial
     outputs are summed (psum over `tensor`);
  4. the return trip is the mirrored ragged_all_to_all; un-sort and combine with the weights.

Quantized experts (the model passes `grouped` / `codec`, see composer_jax.model.moe): the local
GEMMs quantize like the single-device path's, NVFP4 per-tensor scales are reduced over
`amax_axes` (token + tensor axes), so forward outputs and input gradients equal the single-device
ones up to float32 summation order (with a tensor axis, NVFP4 needs F/tp to be a multiple of
16 for that, else its blocks along F differ: still a valid quantization, not an identical one).
Expert-weight gradients quantize along tokens, whose split over devices differs from the single
device's sort: a different valid quantization for NVFP4; for MXFP8, whose power-of-two scales
round every element to the same 3-bit mantissa whatever its block, the same values except for
elements in E4M3's subnormal range (tests/parallel/test_expert_quant.py states the bounds).

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

import dataclasses
import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from composer_jax.errors import ConfigError
from composer_jax.parallel import target
from composer_jax.parallel.collectives import ragged_all_to_all
from composer_jax.parallel.sharding import ParallelContext, check_batch

EXPERT_AXIS = "expert"


@dataclasses.dataclass(frozen=True)
class RowCodec:
    """How token rows travel in the dispatch all-to-all: encode(x [R, D]) -> [R, W] (fewer bytes;
    all-zero encoded rows, the receive buffer's padding, must decode to zeros) and
    decode([R, W]) -> [R, D]. The backward pass sends the rows' gradients back unencoded: the
    codec is transparent to differentiation (straight through), so it should only drop what the
    expert matmul's own quantization drops anyway (see composer_jax.quant.wire)."""

    encode: Callable
    decode: Callable


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _coded_send(codec: RowCodec, route: tuple, rows, in_off, send_sizes, out_off, recv_sizes):
    """decode(ragged_all_to_all(encode(rows))) -> [out_rows, D] in rows' dtype.

    route = (axis name, out_rows, max_send_rows, rows of `rows`) (static)."""
    axis, out_rows, per_peer, _ = route
    enc = codec.encode(rows)
    got = ragged_all_to_all(enc, jnp.zeros((out_rows,) + enc.shape[1:], enc.dtype), in_off, send_sizes,
                            out_off, recv_sizes, axis_name=axis, max_send_rows=per_peer)
    return codec.decode(got).astype(rows.dtype)


def _coded_send_fwd(codec, route, rows, in_off, send_sizes, out_off, recv_sizes):
    out = _coded_send(codec, route, rows, in_off, send_sizes, out_off, recv_sizes)
    return out, (in_off, send_sizes, out_off, recv_sizes)


def _coded_send_bwd(codec, route, res, ct):
    """The transpose of the unencoded all-to-all applied to the cotangent (straight through)."""
    axis, _, per_peer, n_rows = route
    in_off, send_sizes, out_off, recv_sizes = res

    def send(r):
        return ragged_all_to_all(r, jnp.zeros_like(ct), in_off, send_sizes, out_off, recv_sizes,
                                 axis_name=axis, max_send_rows=per_peer)

    (d_rows,) = jax.vjp(send, jnp.zeros_like(ct, shape=(n_rows, ct.shape[1])))[1](ct)
    return d_rows, None, None, None, None


_coded_send.defvjp(_coded_send_fwd, _coded_send_bwd)


def _exclusive_cumsum(x, axis=0):
    return jnp.cumsum(x, axis=axis) - x


def _inverse(perm):
    return jnp.zeros_like(perm).at[perm].set(jnp.arange(perm.shape[0], dtype=perm.dtype))


def ragged_result_dtype(dt):
    """The result dtype of the expert FFN's grouped matmuls: the compute dtype `dt` on
    accelerators (the dot accumulates in float32 and rounds once to `dt`, which is what the
    float32 result followed by `.astype(dt)` did), float32 on CPU (unchanged program).

    XLA:TPU charges a ragged dot with a float32 result and a cast 1.6x the bytes of one with a bf16
    result, and under autodiff the float32 result makes the transposes run on float32
    cotangents and write float32 weight gradients before rounding them: 3.9x the bytes for
    the weight gradient (libtpu 0.0.50, [32768, 2048] x [64, 2048, 1024]; issue 44)."""
    return jnp.float32 if target.platform() == "cpu" else dt


def ragged_grouped(dtype):
    """The default local expert matmul: `jax.lax.ragged_dot` in `dtype` with float32 accumulation
    (result dtype `ragged_result_dtype`), as a `grouped(x, w, group_sizes, tag, amax_axes)`
    callable (tag and axes unused)."""
    def grouped(x, w, group_sizes, tag, amax_axes):
        del tag, amax_axes
        y = jax.lax.ragged_dot(x.astype(dtype), w.astype(dtype), group_sizes,
                               preferred_element_type=ragged_result_dtype(dtype))
        return y.astype(dtype)
    return grouped


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


def _local_dispatch(x, idx, weights, w_gate, w_up, w_down, *, grouped, codec, capacity_factor,
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
    if codec is None:
        buf = ragged_all_to_all(xs, jnp.zeros((rows, d), xs.dtype), in_off, send_sizes, out_off,
                                recv_sizes, axis_name=EXPERT_AXIS, max_send_rows=per_peer)
    else:
        buf = _coded_send(codec, (EXPERT_AXIS, rows, per_peer, xs.shape[0]), xs, in_off, send_sizes,
                          out_off, recv_sizes)
    ids = ragged_all_to_all((sorted_e % e_loc).astype(jnp.int32),
                            jnp.full((rows,), e_loc, jnp.int32), in_off, send_sizes, out_off,
                            recv_sizes, axis_name=EXPERT_AXIS, max_send_rows=per_peer)
    local_order = jnp.argsort(ids, stable=True)
    group_sizes = jnp.bincount(ids, length=e_loc).astype(jnp.int32)             # padding excluded
    xr = buf[local_order]
    axes = token_axes + tensor_axes          # what the local operands are split over
    h = (jax.nn.silu(grouped(xr, w_gate, group_sizes, 1, axes))
         * grouped(xr, w_up, group_sizes, 2, axes))
    yr = grouped(h, w_down, group_sizes, 3, axes)                                # [M, D]
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
                             capacity_factor: float = 0.0, grouped=None, codec: RowCodec | None = None):
    """Expert-parallel MoE. x [B,T,D], idx/weights [B,T,K], w_gate/w_up [E,D,F], w_down [E,F,D]
    (global arrays) -> (y [B,T,D], dropped fraction [] f32). Dropless when capacity_factor == 0.

    grouped: the per-device expert matmul, called inside shard_map as
    grouped(x [M, K], w [E_loc, K, N], group_sizes [E_loc], tag, amax_axes) -> [M, N], where tag
    is 1 / 2 / 3 for the gate / up / down projection (the single-device path's key tags) and
    amax_axes names the mesh axes the operands are split over (for NVFP4 per-tensor scales).
    Default: `ragged_grouped(dtype)`. It may close over traced values (e.g. a PRNG key).
    codec: optional RowCodec for the token rows on the way to the experts (None: x's dtype).
    """
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
    grouped = ragged_grouped(dtype) if grouped is None else grouped
    fn = jax.shard_map(
        lambda *a: _local_dispatch(*a, grouped=grouped, codec=codec, capacity_factor=capacity_factor,
                                   token_axes=token_axes, tensor_axes=tensor_axes),
        in_specs=(tok, tok, tok, P(EXPERT_AXIS, None, tp), P(EXPERT_AXIS, None, tp),
                  P(EXPERT_AXIS, tp, None)),
        out_specs=(tok, P()))
    return fn(x, idx, weights, w_gate, w_up, w_down)
