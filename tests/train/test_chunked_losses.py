"""Token-chunked LM-head losses equal the unchunked ones; the context-parallel MTP shift."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from composer_jax.parallel import context_parallel as cp_lib
from composer_jax.train import losses
from composer_jax.train.lm_loss import shift_left_original_order
from composer_jax.train.loss_api import loss_chunks


def _head_inputs(b=2, t=16, d=6, v=11):
    keys = jax.random.split(jax.random.key(0), 5)
    h = jax.random.normal(keys[0], (b, t, d))
    teacher = jax.random.normal(keys[1], (b, t, d))
    w = jax.random.normal(keys[2], (d, v))
    targets = jax.random.randint(keys[3], (b, t), 0, v)
    mask = (jax.random.uniform(keys[4], (b, t)) > 0.2).astype(jnp.float32)
    return h, teacher, w, targets, mask


def _ce_z(h, targets, mask, w):
    return losses.ce_and_z_sums(h @ w, targets, mask)


def _distill(h, teacher, mask, w):
    return losses.self_distill_sum(h @ w, teacher @ w, mask)


@pytest.mark.parametrize("n", [2, 4, 16])
def test_chunked_sums_and_grads_equal_unchunked(n):
    h, teacher, w, targets, mask = _head_inputs()

    def total(h, teacher, w, n):
        ce, z = losses.sum_over_token_chunks(_ce_z, n, (h, targets, mask), (w,))
        kl = losses.sum_over_token_chunks(_distill, n, (h, teacher, mask), (w,))
        return ce + 0.1 * z + 0.3 * kl, (ce, z, kl)

    (ref, ref_parts), ref_g = jax.value_and_grad(total, argnums=(0, 1, 2), has_aux=True)(
        h, teacher, w, 1)
    (got, got_parts), got_g = jax.value_and_grad(total, argnums=(0, 1, 2), has_aux=True)(
        h, teacher, w, n)
    np.testing.assert_allclose(got_parts, ref_parts, rtol=1e-5)
    logits = h @ w
    np.testing.assert_allclose(ref_parts[0], losses.cross_entropy_sum(logits, targets, mask),
                               rtol=1e-6)
    np.testing.assert_allclose(ref_parts[1], losses.z_loss_sum(logits, mask), rtol=1e-6)
    for a, c in zip(ref_g, got_g):
        np.testing.assert_allclose(c, a, atol=1e-5)
    # the teacher is a stop-gradient target
    assert float(jnp.max(jnp.abs(ref_g[1]))) == 0.0


def test_self_distill_sum_matches_shifted_reference():
    main = jax.random.normal(jax.random.key(0), (2, 6, 7))
    student = jax.random.normal(jax.random.key(1), (2, 6, 7))
    mask = jnp.ones((2, 1, 6)).at[:, :, -1].set(0)
    ref = losses.mtp_self_distill_sums(student[None], main, mask)[0]
    got = losses.self_distill_sum(student, losses.shift_left(main, 1), mask[:, 0])
    np.testing.assert_allclose(got, ref, rtol=1e-6)


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("k", [1, 2])
def test_shift_in_original_order_under_context_parallel_reorder(cp, k):
    x = jnp.arange(2 * 32 * 3, dtype=jnp.float32).reshape(2, 32, 3)
    got = shift_left_original_order(cp_lib.reorder(x, cp, axis=1), k, cp)
    want = cp_lib.reorder(losses.shift_left(x, k), cp, axis=1)
    np.testing.assert_array_equal(got, want)


def test_loss_chunks_keep_sequence_shards_whole():
    assert loss_chunks(4, 16, None, chunk_tokens=2048) == 1
    assert loss_chunks(1, 32768, None, chunk_tokens=2048) == 16
    assert loss_chunks(1, 24, None, chunk_tokens=1) == 8        # 24 = 8 chunks of 3, not 16
    with pytest.raises(ValueError, match="do not split"):
        losses.token_chunks(jnp.zeros((1, 10, 2)), 4)


def test_loss_chunks_cap_logits_bytes_with_a_vocabulary():
    # 1024 tokens x 129,280 x 4 B = 505 MiB of logits: cut to 128-token chunks of 63 MiB
    assert loss_chunks(4, 256, None, chunk_tokens=2048, vocab=129280) == 8
    # 512 x 32,768 x 4 B is exactly 64 MiB: two chunks
    assert loss_chunks(4, 256, None, chunk_tokens=2048, vocab=32768) == 2
    # without a vocabulary (one device: the fused head) only the token cut applies
    assert loss_chunks(4, 256, None, chunk_tokens=2048) == 1
    # the sequence split still bounds the cut: 24 tokens split at most 8 ways
    assert loss_chunks(1, 24, None, chunk_tokens=2048, vocab=10**9) == 8
