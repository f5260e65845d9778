"""The language-modelling loss of pretraining and SFT, registered as "lm".

loss = CE + mtp_lambda * mean_k MTP_k + z_loss * Z + seq_aux_loss_coef * balance, where CE and Z
are sums over valid tokens divided by the global count of valid tokens (`tokens`) and MTP_k is
divided by the count of valid depth-k targets (`mtp_tokens`, [Dm]). MTP_k is cross-entropy against
the token k+1 places ahead (train.mtp_loss=supervised) or KL towards the stop-gradient main head's
distribution (self_distill). The LM head runs inside the token-chunked sums.

Shape glossary: B batch, T tokens, Dm MTP depths, V vocab.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from composer_jax.config import MTPLoss
from composer_jax.parallel import context_parallel as cp_lib
from composer_jax.parallel.batch_schema import LM_FIELDS
from composer_jax.parallel.sharding import shard
from composer_jax.train import losses
from composer_jax.train.loss_api import LossSpec, register_loss


def shift_left_original_order(x: jax.Array, k: int, cp: int) -> jax.Array:
    """x [B,T,...] in load-balanced context-parallel order (cp > 1) or plain order: row j gets the
    row of the token k places later *in the original sequence* (zeros past the end).

    In load-balanced order the sequence is 2*cp contiguous chunks of the original, permuted; a
    shift moves rows within each chunk and brings in the first k rows of the next original chunk.
    Only those [B, 2*cp, k, ...] heads travel between shards, never the whole sequence.
    """
    if cp == 1:
        return losses.shift_left(x, k)
    b, t = x.shape[:2]
    n = 2 * cp
    c = t // n
    if k > c:
        raise ValueError(f"shift by {k} exceeds the context-parallel chunk of {c} tokens")
    chunks = cp_lib.load_balance_permutation(n, cp)          # reordered chunk p = original chunk
    where = np.argsort(chunks)                                # original chunk -> reordered slot
    nxt = np.array([where[o + 1] if o + 1 < n else n for o in chunks])
    xc = shard(x.reshape((b, n, c) + x.shape[2:]), ("batch", "seq", None) + (None,) * (x.ndim - 2))
    heads = jnp.concatenate([xc[:, :, :k], jnp.zeros_like(xc[:, :1, :k])], axis=1)
    heads = jnp.take(heads, jnp.asarray(nxt, jnp.int32), axis=1)          # [B, n, k, ...]
    return jnp.concatenate([xc[:, :, k:], heads], axis=2).reshape(x.shape)


def lm_denominators(batch: dict) -> dict:
    """tokens: valid next-token targets (>= 1); mtp_tokens [Dm]: valid targets per MTP depth."""
    return {"tokens": jnp.maximum(batch["loss_mask"].sum(), 1.0),
            "mtp_tokens": jnp.maximum(batch["mtp_mask"].sum(axis=(0, 2)), 1.0)}


def head_ce_sums(ctx, h: jax.Array, targets: jax.Array, mask: jax.Array, w: jax.Array,
                 z_coef: float):
    """(objective, ce_sum, z_sum) of the LM head on h [B,T,D] against targets/mask [B,T]:
    objective = ce_sum + z_coef * z_sum carries the gradients (ce_sum, z_sum may not).

    One device (no mesh): `losses.fused_head_ce`, vocabulary-tiled with the gradients computed in
    the forward (no [tokens, V] logits, no softmax re-materialisation; the fast path on CPU).
    On a mesh: logits in token chunks (`ctx.chunked_sum`, bounded memory the planner counts on,
    with the vocabulary sharded as the rules say)."""
    if ctx.pc is None:
        dtype = jnp.dtype(ctx.cfg.execution.compute_dtype.value)
        return losses.fused_head_ce(h, w, targets, mask, compute_dtype=dtype, z_coef=z_coef)

    def ce_z(h, targets, mask, w):
        return losses.ce_and_z_sums(ctx.logits(h, w), targets, mask)

    ce_sum, z_sum = ctx.chunked_sum(ce_z, (h, targets, mask), (w,))
    obj = ce_sum + z_coef * z_sum if z_coef > 0 else ce_sum
    return obj, ce_sum, z_sum


def lm_loss(model, batch: dict, ctx):
    """(share of the LM objective, {"ce", "mtp", "z"} shares) of one microbatch."""
    cfg = ctx.cfg
    tc = cfg.train
    denom, mtp_denom = ctx.denominators["tokens"], ctx.denominators["mtp_tokens"]
    out = ctx.forward(model, batch)
    w = ctx.lm_head(model)

    def distill(h, h_teacher, mask, w):
        return losses.self_distill_sum(ctx.logits(h, w), ctx.logits(h_teacher, w), mask)

    obj, ce_sum, z_sum = head_ce_sums(ctx, out.normed, batch["targets"], batch["loss_mask"], w,
                                      tc.z_loss)
    ce = ce_sum / denom
    total = obj / denom          # CE (+ z_loss * Z): the differentiable share
    mtp = jnp.zeros((), jnp.float32)
    if out.mtp_normed is not None:
        sums = []
        for d in range(out.mtp_normed.shape[0]):
            mask = batch["mtp_mask"][:, d]
            if tc.mtp_loss == MTPLoss.SUPERVISED:
                s, _, _ = head_ce_sums(ctx, out.mtp_normed[d], batch["mtp_targets"][:, d], mask,
                                       w, 0.0)
            else:   # depth d at i predicts token i+d+2, which the main head predicts at i+d+1
                teacher = shift_left_original_order(out.normed, d + 1, ctx.cp)
                s = ctx.chunked_sum(distill, (out.mtp_normed[d], teacher, mask), (w,))
            sums.append(s)
        mtp = jnp.mean(jnp.stack(sums) / mtp_denom)
        total = total + tc.mtp_lambda * mtp
    z = jnp.zeros((), jnp.float32)
    if tc.z_loss > 0:
        z = z_sum / denom        # already in `total` (head_ce_sums' objective)
    if cfg.train.seq_aux_loss_coef > 0:
        total = total + cfg.train.seq_aux_loss_coef * out.balance_loss
    return total, {"ce": ce, "mtp": mtp, "z": z}


def lm_metrics(aux: dict, denominators: dict) -> dict:
    return {"ce_loss": aux["ce"], "mtp_loss": aux["mtp"], "z_loss": aux["z"],
            "tokens": denominators["tokens"]}


def lm_eval_metrics(aux: dict, denominators: dict) -> dict:
    """ce_sum and tokens (the loop's validation loss = sum ce_sum / sum tokens), mtp."""
    return {"ce_sum": aux["ce"] * denominators["tokens"], "tokens": denominators["tokens"],
            "mtp": aux["mtp"]}


LM_LOSS = register_loss(LossSpec(
    name="lm", fn=lm_loss, denominators=lm_denominators, schema=LM_FIELDS, metrics=lm_metrics,
    eval_metrics=lm_eval_metrics,
    doc="next-token CE + MTP (supervised or self-distilled) + z-loss + sequence balance loss"))
