"""The one-device CPU fast paths of the model equal the general paths they replace (issue 19).

* `layers.cpu_matmul` (`linear` for float32 plain matmuls on CPU without a mesh): same forward,
  weight gradient through an explicit transpose; checked against `jnp.einsum` autodiff.
* unrolled layer scans (`transformer.unroll_layer_scans`): the same ops without the while loop;
  loss and gradients of the tiny model checked bitwise against the scanned version.
* the gates: off for bf16 compute, and off under a parallel context (the sharded path and the
  planner's figures are unchanged).
"""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from composer_jax.config import ExecutionConfig, tiny
from composer_jax.model import init_model
from composer_jax.model import layers
from composer_jax.model import transformer
from composer_jax.model.layers import Ctx

SPECS = [  # (einsum spec, x shape, w shape) as the model uses them
    ("...d,df->...f", (2, 5, 12), (12, 7)),
    ("...d,df->...f", (9, 12), (12, 20)),
    ("btc,chd->bthd", (2, 5, 8), (8, 3, 6)),
    ("bthv,hvd->btd", (2, 5, 3, 4), (3, 4, 10)),
    ("btd,dhk->bthk", (2, 5, 12), (12, 2, 5)),
]


def test_as_matmul_recognises_plain_matmuls_only():
    assert layers._as_matmul("...d,df->...f", 3, 2) == (2, 1)
    assert layers._as_matmul("btc,chd->bthd", 3, 3) == (2, 1)
    assert layers._as_matmul("bthv,hvd->btd", 4, 3) == (2, 2)
    assert layers._as_matmul("nd,edf->enf", 2, 3) is None            # batched over experts
    assert layers._as_matmul("bthd,bshd->bhts", 4, 4) is None


@pytest.mark.parametrize("spec,xs,ws", SPECS)
def test_linear_fast_path_equals_einsum(spec, xs, ws):
    kx, kw, kg = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, xs)
    w = jax.random.normal(kw, ws)
    ctx = Ctx(cfg=tiny())
    assert layers.use_cpu_matmul(ctx.dtype)
    ref = jnp.einsum(spec, x, w, preferred_element_type=jnp.float32)
    got = jax.jit(lambda x, w: layers.linear(x, w, ctx, spec))(x, w)
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)
    ct = jax.random.normal(kg, ref.shape)
    g_ref = jax.grad(lambda x, w: jnp.sum(jnp.einsum(spec, x, w) * ct), (0, 1))(x, w)
    g_got = jax.jit(jax.grad(lambda x, w: jnp.sum(layers.linear(x, w, ctx, spec) * ct),
                             (0, 1)))(x, w)
    for a, b in zip(g_ref, g_got):
        assert a.shape == b.shape
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def test_cpu_matmul_gates():
    assert layers.use_cpu_matmul(jnp.float32) == (jax.default_backend() == "cpu")
    assert not layers.use_cpu_matmul(jnp.bfloat16)


def test_fast_paths_off_under_a_parallel_context(monkeypatch):
    """Under a ParallelContext neither the CPU matmul nor the unrolled scans are used."""
    import composer_jax.model.layers as layers_mod
    sentinel = object()
    monkeypatch.setattr(layers_mod, "current", lambda: sentinel)   # both gates ask cpu_without_mesh
    assert not layers.use_cpu_matmul(jnp.float32)
    assert not transformer.unroll_layer_scans()


def _loss_and_grads(model, tokens):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(p):
        out = nnx.merge(graphdef, p, rest)(tokens)
        ce = optax.softmax_cross_entropy_with_integer_labels(out.logits[:, :-1], tokens[:, 1:])
        mtp = optax.softmax_cross_entropy_with_integer_labels(out.mtp_logits[0, :, :-2],
                                                              tokens[:, 2:])
        return ce.mean() + 0.3 * mtp.mean()

    return jax.jit(jax.value_and_grad(loss))(params)


@pytest.mark.parametrize("remat", ["none"])
def test_unrolled_layer_scans_equal_scanned(monkeypatch, remat):
    cfg = tiny()
    tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, cfg.vocab_size)
    execution = ExecutionConfig(remat=remat)
    assert transformer.unroll_layer_scans() == (jax.default_backend() == "cpu")
    l1, g1 = _loss_and_grads(init_model(cfg, 0, execution), tokens)
    monkeypatch.setattr(transformer, "unroll_layer_scans", lambda: False)
    l2, g2 = _loss_and_grads(init_model(cfg, 0, execution), tokens)
    assert float(l1) == float(l2)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        np.testing.assert_array_equal(a, b)


def test_attend_cpu_equals_attend_with_packing():
    """`attention.attend_cpu` (the float32 CPU attention of the MLA layer) against `attend`:
    output and the gradients of q, k, v agree to float32 rounding (max abs diff ~1e-7 here)."""
    from composer_jax.model.attention import attend, attend_cpu, attention_mask
    b, t, h, dk, dv = 2, 19, 3, 12, 8
    ks = jax.random.split(jax.random.key(4), 5)
    q = jax.random.normal(ks[0], (b, t, h, dk))
    k = jax.random.normal(ks[1], (b, t, h, dk))
    v = jax.random.normal(ks[2], (b, t, h, dv))
    seg = jnp.cumsum(jax.random.uniform(ks[3], (b, t)) < 0.2, axis=1) + 1     # packed documents
    idx = jnp.broadcast_to(jnp.arange(t), (b, t))
    mask = attention_mask(seg, seg, idx, idx)
    ct = jax.random.normal(ks[4], (b, t, h, dv))

    def loss(fn):
        return jax.jit(jax.value_and_grad(
            lambda q, k, v: jnp.sum(fn(q, k, v, mask, 0.3) * ct), (0, 1, 2)))(q, k, v)

    (l_ref, g_ref), (l_got, g_got) = loss(attend), loss(attend_cpu)
    np.testing.assert_allclose(attend_cpu(q, k, v, mask, 0.3), attend(q, k, v, mask, 0.3),
                               atol=1e-6)
    np.testing.assert_allclose(l_got, l_ref, rtol=1e-6)
    for a, c in zip(g_ref, g_got):
        assert a.shape == c.shape
        np.testing.assert_allclose(c, a, atol=1e-5)
