"""The fused, vocabulary-tiled LM head + CE equals the logits path in value and gradients."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from composer_jax.model.transformer import lm_logits
from composer_jax.train import losses


def _inputs(b=2, t=8, d=16, v=96, dtype=jnp.float32):
    keys = jax.random.split(jax.random.key(3), 4)
    h = jax.random.normal(keys[0], (b, t, d)).astype(dtype)
    w = jax.random.normal(keys[1], (d, v)) * 0.5
    targets = jax.random.randint(keys[2], (b, t), 0, v)
    mask = (jax.random.uniform(keys[3], (b, t)) > 0.25).astype(jnp.float32)
    return h, w, targets, mask


@pytest.mark.parametrize("tile", [None, 96, 32, 8])
@pytest.mark.parametrize("z_coef", [0.0, 0.1])
def test_fused_equals_logits_path_f32(tile, z_coef):
    h, w, targets, mask = _inputs()

    def ref(h, w):
        ce, z = losses.ce_and_z_sums(lm_logits(h, w, jnp.float32), targets, mask)
        return ce + z_coef * z, (ce, z)

    def fused(h, w):
        obj, ce, z = losses.fused_head_ce(h, w, targets, mask, compute_dtype=jnp.float32,
                                          z_coef=z_coef, tile=tile)
        return obj, (ce, z)

    (r, r_parts), r_g = jax.value_and_grad(ref, (0, 1), has_aux=True)(h, w)
    (f, f_parts), f_g = jax.jit(jax.value_and_grad(fused, (0, 1), has_aux=True))(h, w)
    np.testing.assert_allclose(f, r, rtol=1e-5)
    np.testing.assert_allclose(f_parts, r_parts, rtol=1e-5)
    for a, c in zip(r_g, f_g):
        np.testing.assert_allclose(c, a, atol=2e-5)
    # a cotangent other than 1 scales the precomputed gradients
    g2 = jax.grad(lambda h, w: 3.0 * fused(h, w)[0], (0, 1))(h, w)
    np.testing.assert_allclose(g2[1], 3.0 * r_g[1], atol=6e-5)
    # without differentiation only the logsumexp pass runs; same value
    np.testing.assert_allclose(jax.jit(fused)(h, w)[0], r, rtol=1e-5)


def test_fused_bf16_matches_bf16_logits_path_and_runs_on_cpu():
    """bf16 matmuls with f32 accumulation (XLA:CPU runs them; one tile and many tiles)."""
    h, w, targets, mask = _inputs(d=32, v=256, dtype=jnp.bfloat16)
    ref = jax.value_and_grad(lambda h, w: losses.ce_and_z_sums(
        lm_logits(h, w, jnp.bfloat16), targets, mask)[0], (0, 1))(h, w)
    for tile in (256, 64):
        got = jax.jit(jax.value_and_grad(lambda h, w, t=tile: losses.fused_head_ce(
            h, w, targets, mask, compute_dtype=jnp.bfloat16, tile=t)[0], (0, 1)))(h, w)
        np.testing.assert_allclose(got[0], ref[0], rtol=1e-4)
        assert got[1][0].dtype == jnp.bfloat16 and got[1][1].dtype == jnp.float32
        # dh in bf16: the two paths round differently (by about one bf16 ulp)
        np.testing.assert_allclose(got[1][0].astype(np.float32), ref[1][0].astype(np.float32),
                                   atol=1e-2, rtol=2e-2)
        np.testing.assert_allclose(got[1][1], ref[1][1].astype(np.float32), atol=2e-2, rtol=2e-2)


def test_vocab_tile_divides_and_respects_budget():
    assert losses.vocab_tile(129280, 1024) == 2560 or 129280 % losses.vocab_tile(129280, 1024) == 0
    for v, n in [(129280, 1024), (32768, 1024), (163840, 2048), (256, 1024), (4099, 1024)]:
        t = losses.vocab_tile(v, n)
        assert v % t == 0
        assert t * n <= losses.FUSED_TILE_ELEMENTS or t == v or t >= 128
    assert losses.vocab_tile(32768, 1024) == 4096
    assert losses.vocab_tile(256, 1024) == 256
    with pytest.raises(ValueError, match="does not divide"):
        losses.fused_head_ce(jnp.zeros((1, 2, 4)), jnp.zeros((4, 10)), jnp.zeros((1, 2), int),
                             jnp.ones((1, 2)), compute_dtype=jnp.float32, tile=3)


@pytest.mark.parametrize("z_coef", [0.0, 0.1])
def test_stored_tiles_equal_recomputed_tiles(monkeypatch, z_coef):
    """Small heads keep each tile's logits for the gradient (unrolled); larger ones recompute
    them in a scan. Same tiles and arithmetic: equal within float32 rounding (measured max
    difference 0 to a few ulp)."""
    h, w, targets, mask = _inputs(t=16, v=128)

    def run():
        return jax.jit(jax.value_and_grad(lambda h, w: losses.fused_head_ce(
            h, w, targets, mask, compute_dtype=jnp.float32, z_coef=z_coef, tile=32)[0],
            (0, 1)))(h, w)

    assert 32 * 128 <= losses.FUSED_STORE_ELEMENTS
    stored = run()
    monkeypatch.setattr(losses, "FUSED_STORE_ELEMENTS", 0)
    recomputed = run()
    np.testing.assert_allclose(stored[0], recomputed[0], rtol=1e-6)
    for a, b in zip(stored[1], recomputed[1]):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
