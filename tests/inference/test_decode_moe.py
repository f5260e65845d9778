"""The decode step's MoE dispatch (`inference/moe.py`): every path computes the exact expert sums
of a reference that runs each assignment on its own, and the shape picks the path it documents."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from composer_jax.inference import moe as im


def _reference(x, idx, w, wg, wu, wd):
    """sum_k w[n,k] * FFN_{idx[n,k]}(x[n]) in float64, one assignment at a time."""
    x, w, wg, wu, wd = (np.asarray(a, np.float64) for a in (x, w, wg, wu, wd))
    out = np.zeros_like(x)
    for n in range(x.shape[0]):
        for k, e in enumerate(np.asarray(idx[n])):
            g, u = x[n] @ wg[e], x[n] @ wu[e]
            out[n] += w[n, k] * ((g / (1 + np.exp(-g)) * u) @ wd[e])
    return out


@pytest.mark.parametrize("n", [1, 4, 8, 32, 77])
@pytest.mark.parametrize("fn", [im.experts_gather, im.experts_blocked], ids=["gather", "blocked"])
def test_paths_equal_the_per_assignment_reference(fn, n):
    e, k, d, f = 32, 4, 48, 24
    ks = jax.random.split(jax.random.key(n), 6)
    x = jax.random.normal(ks[0], (n, d))
    wg, wu = (jax.random.normal(kk, (e, d, f)) * 0.2 for kk in ks[1:3])
    wd = jax.random.normal(ks[3], (e, f, d)) * 0.2
    # skewed routing: a few experts take most assignments (blocks of one expert overflow)
    logits = jax.random.normal(ks[4], (n, e)) + jnp.where(jnp.arange(e) < 3, 3.0, 0.0)
    idx = jnp.argsort(-logits, axis=1)[:, :k].astype(jnp.int32)
    w = jax.nn.softmax(jax.random.normal(ks[5], (n, k)))
    got = np.asarray(jax.jit(lambda *a: fn(*a, jnp.float32))(x, idx, w, wg, wu, wd))
    np.testing.assert_allclose(got, _reference(x, idx, w, wg, wu, wd), rtol=1e-4, atol=1e-5)


def test_the_shape_picks_the_documented_path():
    e, k = 32, 4
    assert im.dispatch_path(8, k, e) == "gather"                  # 32 assignments <= E
    assert im.dispatch_path(9, k, e) == "blocked"                 # 36 > E
    assert im.dispatch_path(32, k, e) == "blocked"
    assert im.dispatch_path(im.DECODE_BLOCK_MAX_ASSIGNMENTS // k + 1, k, e) == "model"
    assert im.dispatch_path(1, k, e, fmt="mxfp8") == "model"
    assert im.dispatch_path(1, k, e, expert_parallel=True) == "model"
