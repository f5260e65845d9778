"""The model's low-precision matmuls: MXFP8/NVFP4 FFN and expert GEMMs through composer_jax.quant."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from composer_jax.config import Config, ExecutionConfig, TrainConfig, tiny
from composer_jax.data.config import DataConfig
from composer_jax.model import init_model
from composer_jax.train.step import build


def _cfg():
    # widths that are multiples of the 32-element MXFP8 blocks
    return dataclasses.replace(tiny(), hidden_size=64, moe_intermediate_size=32,
                               dense_intermediate_size=128)


def _model(precision, **kw):
    return init_model(_cfg(), 0, ExecutionConfig(precision=precision, **kw))


def _batch(b=4, t=16, v=256):
    rng = np.random.default_rng(0)
    toks = rng.integers(0, v, (b, t)).astype(np.int32)
    m = np.ones((b, t), np.float32)
    m[:, -1] = 0
    mm = np.ones((b, 1, t), np.float32)
    mm[:, :, -2:] = 0
    return dict(tokens=toks, positions=np.tile(np.arange(t, dtype=np.int32), (b, 1)),
                segment_ids=np.ones((b, t), np.int32), targets=np.roll(toks, -1, 1), loss_mask=m,
                mtp_targets=np.roll(toks, -2, 1)[:, None], mtp_mask=mm)


@pytest.mark.parametrize("precision, bound", [("mxfp8", 0.08), ("nvfp4", 0.3)])
def test_quantized_forward_close_to_bf16(precision, bound):
    tokens = jnp.asarray(_batch()["tokens"])
    ref = _model("bf16")(tokens).logits
    got = _model(precision)(tokens).logits
    rel = float(jnp.linalg.norm(got - ref) / jnp.linalg.norm(ref))
    assert 0 < rel < bound, rel


def test_last_blocks_stay_bf16():
    tokens = jnp.asarray(_batch()["tokens"])
    ref = _model("bf16")(tokens, with_mtp=False).logits
    all_bf16 = _model("mxfp8", quant_bf16_last_blocks=2)(tokens, with_mtp=False).logits
    np.testing.assert_allclose(all_bf16, ref, atol=1e-6)   # 2 of 2 blocks kept in BF16
    one = _model("mxfp8", quant_bf16_last_blocks=1)(tokens, with_mtp=False).logits
    assert float(jnp.max(jnp.abs(one - ref))) > 1e-5


@pytest.mark.parametrize("precision", ["mxfp8", "nvfp4"])
def test_trains_a_few_steps(precision):
    cfg = Config(model=_cfg(), execution=ExecutionConfig(precision=precision),
                 train=TrainConfig(steps=20, warmup_steps=0, lr=3e-3),
                 data=DataConfig(global_batch_size=4, vocab_size=512))
    fns, state = build(_model(precision), cfg)
    b = _batch()
    losses = []
    for _ in range(6):
        state, m = fns.train_step(state, b)
        losses.append(float(m["ce_loss"]))
        assert float(m["update_skipped"]) == 0.0
    assert losses[-1] < losses[0] - 0.1, losses
