"""Next-token and multi-token-prediction targets of packed rows, computed per segment.

Glossary: B rows, T tokens per row, Dm MTP depths (D is the model dim elsewhere). Inputs
`[B, T]`: tokens, segment_ids (0 = padding), trainable (non-zero where a target token may carry
loss: 1, or `chat.VALUE_START` (2) on the first token of a tool call's argument value).
The target at offset o of position i is tokens[i + o]; it is *valid* when i + o < T and
segment_ids[i + o] == segment_ids[i] != 0 (segment ids of a row are contiguous runs, so equal ids
mean the same document). Invalid targets are 0 and masked; a valid target is trained when
trainable[i + o] is non-zero, with weight 1, or `value_weight` where it is VALUE_START (the masks
are loss weights; losses divide by their sum, so a weight above 1 is a weighted mean).

  targets      [B, T]     offset 1                              loss_mask [B, T]     float32
  mtp_targets  [B, Dm, T] depth k: offset 1 + k (k = 1..Dm)     mtp_mask [B, Dm, T]  float32
"""

from __future__ import annotations

import numpy as np

VALUE_START = 2     # trainable code of an argument value's first token (written by data.chat)


def loss_weights(trainable: np.ndarray, value_weight: float = 1.0) -> np.ndarray:
    """float32 weights of trainable codes: 0 where 0, value_weight where VALUE_START, else 1."""
    weights = (trainable != 0).astype(np.float32)
    if value_weight != 1.0:
        weights[trainable == VALUE_START] = value_weight
    return weights


def shifted_targets(tokens: np.ndarray, segment_ids: np.ndarray, trainable: np.ndarray,
                    offset: int, value_weight: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """`(targets [B, T] int32, mask [B, T] float32)` for tokens `offset` positions ahead."""
    batch, length = tokens.shape
    targets = np.zeros((batch, length), dtype=np.int32)
    mask = np.zeros((batch, length), dtype=np.float32)
    if offset < length:
        here, ahead = segment_ids[:, :length - offset], segment_ids[:, offset:]
        valid = (here == ahead) & (here != 0)
        targets[:, :length - offset] = np.where(valid, tokens[:, offset:], 0)
        mask[:, :length - offset] = valid * loss_weights(trainable[:, offset:], value_weight)
    return targets, mask


def add_targets(rows: dict[str, np.ndarray], mtp_depth: int, value_weight: float = 1.0) -> dict[str, np.ndarray]:
    """The batch contract from packed rows `{tokens, segment_ids, positions, trainable}` `[B, T]`."""
    tokens, segment_ids, trainable = rows["tokens"], rows["segment_ids"], rows["trainable"]
    targets, loss_mask = shifted_targets(tokens, segment_ids, trainable, 1, value_weight)
    batch, length = tokens.shape
    mtp_targets = np.zeros((batch, mtp_depth, length), dtype=np.int32)
    mtp_mask = np.zeros((batch, mtp_depth, length), dtype=np.float32)
    for k in range(1, mtp_depth + 1):
        mtp_targets[:, k - 1], mtp_mask[:, k - 1] = shifted_targets(tokens, segment_ids, trainable, 1 + k,
                                                                       value_weight)
    return {
        "tokens": tokens.astype(np.int32, copy=False),
        "positions": rows["positions"].astype(np.int32, copy=False),
        "segment_ids": segment_ids.astype(np.int32, copy=False),
        "targets": targets,
        "loss_mask": loss_mask,
        "mtp_targets": mtp_targets,
        "mtp_mask": mtp_mask,
    }
