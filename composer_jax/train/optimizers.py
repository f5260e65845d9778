"""Optimizers: AdamW, or Muon on matrices with AdamW on the rest; weight-decay masks from the
parameters' logical axis names (no decay on norms; router biases are not parameters at all)."""
from __future__ import annotations

import jax
import optax
from optax.contrib import MuonDimensionNumbers

from composer_jax.config import Optimizer, TrainConfig
from composer_jax.train.muon import muon
from composer_jax.train.schedules import make_schedule

# Leading logical axes that stack independent matrices (Muon orthogonalises each separately).
_BATCH_AXES = ("layers", "expert")
# Parameters Muon should not touch (AdamW instead): embeddings and the LM head, as in Muon's
# reference recipe and Kimi K2's MuonClip.
_ADAM_ONLY = ("embed", "lm_head")


def _is_norm(axes) -> bool:
    return axes[-1] == "norm"


def decay_mask(axes_tree) -> dict:
    """True for leaves that get weight decay: every matrix, not norm weights."""
    return jax.tree.map(lambda a: not _is_norm(a), axes_tree, is_leaf=lambda x: isinstance(x, tuple))


def muon_dims(axes_tree, paths_tree) -> dict:
    """MuonDimensionNumbers per leaf (None = AdamW): reduction = input axes, output = the rest.

    Our matrices are stored [*batch, in..., out...]; the attention output wo is [H, Dv, D] (two
    input axes), wq_b / wkv_b / wq are [in, H, d] (two output axes).
    """
    def dims(axes, path):
        core = [a for a in axes if a not in _BATCH_AXES]
        if len(core) < 2 or _is_norm(axes) or path.split(".")[0] in _ADAM_ONLY:
            return None
        n = len(axes)
        first = n - len(core)
        name = path.split(".")[-1]
        if name == "wo":
            return MuonDimensionNumbers(reduction_axis=(first, first + 1), output_axis=first + 2)
        return MuonDimensionNumbers(reduction_axis=first, output_axis=tuple(range(first + 1, n)))

    return jax.tree.map(dims, axes_tree, paths_tree, is_leaf=lambda x: isinstance(x, tuple))


def make_optimizer(cfg: TrainConfig, axes_tree, paths_tree) -> optax.GradientTransformation:
    """Gradient clipping + AdamW (or Muon/AdamW) with the configured schedule."""
    lr = make_schedule(cfg)
    mask = decay_mask(axes_tree)
    if cfg.optimizer == Optimizer.ADAMW:
        opt = optax.adamw(lr, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay, mask=mask)
    else:
        # Our Muon (train/muon.py), not optax.contrib.muon: optax merges the stacking axes
        # (layers x expert) into one before Newton-Schulz, which loses the expert sharding.
        # Norm weights get no decay on the AdamW side either (optax's muon decays them).
        opt = muon(lr, muon_dims(axes_tree, paths_tree), beta=cfg.b1,
                   weight_decay=cfg.weight_decay, weight_decay_mask=mask, consistent_rms=0.2,
                   adam_b1=cfg.b1, adam_b2=cfg.b2, adam_weight_decay=cfg.weight_decay,
                   adam_weight_decay_mask=mask)
    chain = [optax.clip_by_global_norm(cfg.grad_clip)] if cfg.grad_clip > 0 else []
    return optax.chain(*chain, opt)
