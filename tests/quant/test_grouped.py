"""The blocked grouped matmul equals jax.lax.ragged_dot, forward and gradients."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from composer_jax.quant.grouped import GroupedImpl, blocked_grouped_matmul, grouped_matmul


@pytest.mark.parametrize("sizes", [[10, 0, 33, 5], [48, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0],
                                   [70, 1, 0, 29]])
def test_blocked_equals_ragged_dot(sizes):
    m = 100                                  # rows past sum(sizes) must come out 0
    x = jax.random.normal(jax.random.key(0), (m, 8))
    w = jax.random.normal(jax.random.key(1), (4, 8, 6))
    gs = jnp.array(sizes, jnp.int32)
    ref = jax.lax.ragged_dot(x, w, gs, precision="highest")
    got = blocked_grouped_matmul(x, w, gs, block=16, precision="highest")
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    loss = lambda f: (lambda x, w: jnp.sum(jnp.sin(f(x, w))))  # noqa: E731
    g_ref = jax.grad(loss(lambda x, w: jax.lax.ragged_dot(x, w, gs, precision="highest")),
                     argnums=(0, 1))(x, w)
    g_got = jax.grad(loss(lambda x, w: blocked_grouped_matmul(x, w, gs, block=16,
                                                              precision="highest")),
                     argnums=(0, 1))(x, w)
    for a, b in zip(g_ref, g_got):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def test_dispatch_choice():
    x = jnp.ones((8, 4))
    w = jnp.ones((2, 4, 3))
    gs = jnp.array([3, 5], jnp.int32)
    a = grouped_matmul(x, w, gs, GroupedImpl.RAGGED_DOT)
    b = grouped_matmul(x, w, gs, GroupedImpl.BLOCKED)
    np.testing.assert_allclose(a, b)
