"""The training state: everything a train step reads and returns, as plain pytrees."""
from __future__ import annotations

from typing import Any

import jax
from flax import struct


@struct.dataclass
class TrainState:
    """Everything that changes during training, as plain pytrees (dicts of arrays)."""
    step: jax.Array
    params: dict                # trainable parameters (nnx.Param), pure dict
    buffers: dict               # non-trained state (router selection biases), pure dict
    opt_state: Any
    nonfinite_streak: jax.Array
    nonfinite_total: jax.Array
