"""Blocked (FlashAttention-style) attention, over given K/V and over the MLA latent."""
import functools

import jax
import jax.numpy as jnp
import numpy as np

from composer_jax.model.attention import (_latent_attention, attend, attention_mask,
                                          flash_attention, mla_kv)

B, T, H = 2, 37, 3
SEG = jnp.array([[1] * 20 + [2] * 17, [1] * 30 + [0] * 7])
IDX = jnp.broadcast_to(jnp.arange(T), (B, T))


def _sin_sum(f):
    return lambda *a: jnp.sum(jnp.sin(f(*a)))


def test_latent_flash_attention_equals_expanded_attention():
    c_dim, n, r, dv = 6, 4, 2, 5
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (B, T, H, n + r))
    c = jax.random.normal(keys[1], (B, T, c_dim))
    k_pe = jax.random.normal(keys[2], (B, T, 1, r))
    w = 0.5 * jax.random.normal(keys[3], (c_dim, H, n + dv))

    def ref(q, c, k_pe, w):
        k, v = mla_kv(n, jnp.float32, w, c, k_pe)
        return attend(q, k, v, attention_mask(SEG, SEG, IDX, IDX), 0.3)

    def blocked(q, c, k_pe, w):
        return _latent_attention(q, c, k_pe, w, SEG, SEG, IDX, IDX, 0.3, 8, n, jnp.float32)

    args = (q, c, k_pe, w)
    np.testing.assert_allclose(blocked(*args), ref(*args), atol=1e-5)
    g_ref = jax.grad(_sin_sum(ref), argnums=(0, 1, 2, 3))(*args)
    g = jax.grad(_sin_sum(blocked), argnums=(0, 1, 2, 3))(*args)
    for a, b in zip(g_ref, g):
        np.testing.assert_allclose(b, a, atol=2e-5)


def test_flash_attention_saves_no_per_block_state():
    """The backward needs q, K/V inputs, output and log-sum-exp only: no [blocks, ...] residuals
    of the running output (what differentiating the online-softmax loop would keep)."""
    q = jnp.ones((1, 64, 2, 8))
    kv = (jnp.ones((1, 64, 2, 8)), jnp.ones((1, 64, 2, 8)))
    f = functools.partial(flash_attention, make_kv=lambda p, k, v: (k, v), scale=0.1, kv_block=8)
    idx = jnp.arange(64)[None]
    seg = jnp.ones((1, 64), jnp.int32)
    _, vjp = jax.vjp(lambda q, kv: f(q, kv, (), seg, seg, idx, idx), q, kv)
    residual_shapes = [x.shape for x in jax.tree.leaves(vjp)]
    assert not any(len(s) >= 4 and s[0] == 8 for s in residual_shapes), residual_shapes
