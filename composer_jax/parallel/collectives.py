"""`ragged_all_to_all` with a portable fallback.

XLA:CPU has no `ragged-all-to-all` op, so on CPU (tests, the dry-run planner) the same contract is
emulated with a padded `all_to_all`: every source sends a fixed block of L rows (the static bound
on one send, at most its whole operand, masked to the slice) to every peer, and the receiver scatters the valid rows to their offsets. The
emulation moves P x L rows instead of the ragged sizes; results and gradients are identical.

Shape glossary: L operand rows, M output rows, P size of the mapped axis.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from composer_jax.parallel import target


def _emulated(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, axis_name,
              max_send_rows=None):
    p = send_sizes.shape[0]
    rows = min(operand.shape[0], max_send_rows or operand.shape[0])
    r = jnp.arange(rows)
    src = input_offsets[:, None] + r[None, :]                                # [P, L]
    valid = r[None, :] < send_sizes[:, None]
    chunks = operand[jnp.clip(src, 0, operand.shape[0] - 1)]                             # [P, L, ...]
    chunks = jnp.where(valid.reshape(valid.shape + (1,) * (operand.ndim - 1)), chunks, 0)
    recv = jax.lax.all_to_all(chunks, axis_name, 0, 0)                       # [P(src), L, ...]
    dst_off = jax.lax.all_to_all(output_offsets, axis_name, 0, 0, tiled=True)
    pos = dst_off[:, None] + r[None, :]
    pos = jnp.where(r[None, :] < recv_sizes[:, None], pos, output.shape[0])  # invalid: dropped
    return output.at[pos.reshape(-1)].set(recv.reshape((p * rows,) + operand.shape[1:]),
                                          mode="drop")


def ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, *,
                      axis_name: str, max_send_rows: int | None = None):
    """`jax.lax.ragged_all_to_all` on GPU/TPU; an exact padded emulation on CPU.

    max_send_rows: a static bound on any one send size (the emulation's block size; every size
    must respect it)."""
    if target.platform() == "cpu":
        return _emulated(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes,
                         axis_name, max_send_rows)
    return jax.lax.ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets,
                                     recv_sizes, axis_name=axis_name)
