"""What remat none saves for the backward pass (issue 44: the mid-size step's residuals).

  * `moe.swiglu` and `moe.combine` (hand-written backward passes that keep fewer / narrower
    buffers) give autodiff's gradients;
  * on a mesh, remat none saves no gathered compute-dtype copy of a layer's weights (the policy
    `sharding.saves_all_but_gathered`), and its gradients are those of the plain body.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax._src.ad_checkpoint import saved_residuals

from composer_jax.config import ExecutionConfig, tiny
from composer_jax.config.mesh import MeshConfig
from composer_jax.model import init_model
from composer_jax.model.layers import rms_norm_lean, swiglu
from composer_jax.model.moe import combine
from composer_jax.parallel.mesh import make_mesh
from composer_jax.parallel.sharding import activate, context_from_config
from composer_jax.parallel.target import compiling_for


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_swiglu_and_combine_gradients_match_autodiff(dtype):
    k1, k2, k3, k4 = jax.random.split(jax.random.key(0), 4)
    g = jax.random.normal(k1, (64, 16), dtype)
    u = jax.random.normal(k2, (64, 16), dtype)
    y = jax.random.normal(k3, (8, 4, 16), dtype)
    w = jax.nn.softmax(jax.random.normal(k4, (8, 4)), -1)

    def ours(g, u, y, w):
        return jnp.sum(jnp.sin(swiglu(g, u).astype(jnp.float32))) + jnp.sum(
            jnp.cos(combine(y, w)))

    def ref(g, u, y, w):
        return jnp.sum(jnp.sin((jax.nn.silu(g) * u).astype(jnp.float32))) + jnp.sum(
            jnp.cos(jnp.einsum("nkd,nk->nd", y.astype(jnp.float32), w)))

    a = jax.grad(ours, argnums=(0, 1, 2, 3))(g, u, y, w)
    b = jax.grad(ref, argnums=(0, 1, 2, 3))(g, u, y, w)
    tol = 1e-6 if dtype == jnp.float32 else 2e-2
    for x, r in zip(a, b):
        assert x.dtype == r.dtype
        np.testing.assert_allclose(np.asarray(x, np.float32), np.asarray(r, np.float32),
                                   atol=tol, rtol=tol)
    # swiglu keeps g and u only; autodiff keeps sigmoid(g) and friends too
    mine = saved_residuals(lambda g, u: jnp.sum(swiglu(g, u)), g, u)
    auto = saved_residuals(lambda g, u: jnp.sum(jax.nn.silu(g) * u), g, u)
    assert len(mine) == 2 and len(auto) > len(mine)


def _residuals_and_grads(mesh_devices: int | None):
    cfg = tiny()
    model = init_model(cfg, 0, ExecutionConfig(param_dtype="float32", compute_dtype="bfloat16",
                                               remat="none"))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, cfg.vocab_size)

    def loss(p):
        return jnp.mean(nnx.merge(graphdef, p, rest)(tokens).logits.astype(jnp.float32))

    # traced as for an accelerator: the MoE runs `dispatch_ragged` (jax.lax.ragged_dot, which
    # XLA:CPU executes), not the CPU blocked layout
    with compiling_for("tpu"):
        if mesh_devices is None:
            return saved_residuals(loss, params), jax.jit(jax.grad(loss))(params), model
        mc = MeshConfig(fsdp=mesh_devices)
        mesh = make_mesh(mc, devices=jax.devices()[:mesh_devices])
        with activate(context_from_config(mesh, mc)):
            return saved_residuals(loss, params), jax.jit(jax.grad(loss))(params), model


def test_remat_none_on_a_mesh_saves_no_gathered_weights():
    res_mesh, g_mesh, model = _residuals_and_grads(1)
    res_plain, g_plain, _ = _residuals_and_grads(None)
    moe = model.moe_layers.ffn
    # the stacked [L, E, D, F] expert weights in the compute dtype (bf16)
    stacked = {tuple(v[...].shape) for v in (moe.w_gate, moe.w_up, moe.w_down)}

    def weight_copies(res):
        return [a for a, _ in res if tuple(a.shape) in stacked and a.dtype == jnp.bfloat16]
    assert weight_copies(res_plain), "plain autodiff keeps the bf16 expert weights"
    assert not weight_copies(res_mesh), [str(a) for a in weight_copies(res_mesh)]
    for a, b in zip(jax.tree.leaves(g_mesh), jax.tree.leaves(g_plain)):
        # bf16 compute: the lean backward passes (`swiglu`, `rms_norm_lean`, `expert_ffn`) round
        # in their own places: equal to bf16 precision
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                   atol=1e-4, rtol=2e-2)


@pytest.mark.parametrize("compute", ["float32", "bfloat16"])
def test_expert_ffn_matches_autodiff_dispatch(compute):
    """`dispatch_ragged` under remat none (the `expert_ffn` op) gives the values and gradients
    of its autodiff path (any other remat policy), traced as for an accelerator."""
    from composer_jax.model.layers import Ctx
    from composer_jax.model.moe import dispatch_ragged
    n, k, e, d, f = 24, 2, 4, 16, 8
    ks = jax.random.split(jax.random.key(2), 6)
    x = jax.random.normal(ks[0], (n, d))
    idx = jax.random.randint(ks[1], (n, k), 0, e)
    wts = jax.nn.softmax(jax.random.normal(ks[2], (n, k)), -1)
    ws = [0.3 * jax.random.normal(ks[3 + i], s) for i, s in
          enumerate([(e, d, f), (e, d, f), (e, f, d)])]

    def run(remat):
        ctx = Ctx(tiny(), ExecutionConfig(compute_dtype=compute, remat=remat))

        def loss(x, wts, *ws):
            y = dispatch_ragged(x, idx, wts, *ws, ctx)
            return jnp.sum(jnp.sin(y.astype(jnp.float32))), y
        with compiling_for("tpu"):
            return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4), has_aux=True))(
                x, wts, *ws)
    (l1, y1), g1 = run("none")
    (l2, y2), g2 = run("full")
    tol = 1e-5 if compute == "float32" else 2e-2
    np.testing.assert_allclose(np.asarray(y1, np.float32), np.asarray(y2, np.float32), atol=tol)
    for a, b in zip(g1, g2):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                   atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_rms_norm_lean_gradients_match_autodiff(dtype):
    from composer_jax.model.layers import rms_norm
    x = jax.random.normal(jax.random.key(3), (4, 6, 48), dtype) * 3
    w = 1 + 0.1 * jax.random.normal(jax.random.key(4), (48,), jnp.float32)

    def loss(norm, x, w):
        return jnp.sum(jnp.sin(norm(x, w, 1e-6).astype(jnp.float32)))
    a = jax.grad(lambda x, w: loss(rms_norm_lean, x, w), argnums=(0, 1))(x, w)
    b = jax.grad(lambda x, w: loss(rms_norm, x, w), argnums=(0, 1))(x, w)   # no context
    np.testing.assert_array_equal(rms_norm_lean(x, w, 1e-6), rms_norm(x, w, 1e-6))
    tol = 1e-5 if dtype == jnp.float32 else 2e-2
    for p, r in zip(a, b):
        assert p.dtype == r.dtype
        np.testing.assert_allclose(np.asarray(p, np.float32), np.asarray(r, np.float32),
                                   atol=tol, rtol=tol)
    # keeps x and w only
    assert len(saved_residuals(lambda x, w: jnp.sum(rms_norm_lean(x, w, 1e-6)), x, w)) == 2

