"""Our Muon (composer_jax.train.muon) == optax.contrib.muon, and it keeps stacked axes sharded."""
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
from optax.contrib import MuonDimensionNumbers as MDN
from optax.contrib import muon as optax_muon

from composer_jax.train.muon import muon, orthogonalize

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SHAPES = {
    "w2d": (12, 20),                  # plain matrix, in < out
    "w2d_tall": (24, 8),              # in > out (transposed Newton-Schulz)
    "experts": (2, 3, 16, 10),        # [layers, expert, in, out]
    "wo": (2, 4, 3, 16),              # [layers, H, Dv, D]: two reduction axes
    "wq": (2, 16, 4, 3),              # [layers, in, H, d]: two output axes
    "norm": (2, 16),                  # AdamW, no decay in make_optimizer
    "embed": (32, 16),                # AdamW
}
DIMS = {
    "w2d": MDN(0, 1), "w2d_tall": MDN(0, 1), "experts": MDN(2, 3), "wo": MDN((1, 2), 3),
    "wq": MDN(1, (2, 3)), "norm": None, "embed": None,
}


def _tree(seed, scale=1.0):
    keys = jax.random.split(jax.random.key(seed), len(SHAPES))
    return {k: scale * jax.random.normal(key, s, jnp.float32)
            for key, (k, s) in zip(keys, SHAPES.items())}


def _rel(a, b):
    return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))


def _run(tx, params, steps=4):
    state = tx.init(params)
    upd = jax.jit(tx.update)
    for i in range(steps):
        g = _tree(100 + i, 0.1)
        u, state = upd(g, state, params)
        params = optax.apply_updates(params, u)
    return params


def test_orthogonalize_matches_optax_per_leaf():
    from optax.contrib._muon import orthogonalize_via_newton_schulz
    x = _tree(1)
    coeffs = jnp.asarray((3.4445, -4.7750, 2.0315))
    for k, d in DIMS.items():
        if d is None:
            continue
        ours = orthogonalize(x[k], d)
        ref = orthogonalize_via_newton_schulz(x[k], coeffs, 5, "frobenius", 1e-8, d)
        assert ours.shape == x[k].shape
        # float32 rounding differs (batched vs plain matmuls), amplified by 5 quintic steps
        print(f"orthogonalize {k}: max|diff|/max|ref| = {_rel(ours, ref):.2e}")
        assert _rel(ours, ref) < 5e-6, (k, _rel(ours, ref))


def test_muon_matches_optax_several_steps():
    lr = optax.warmup_cosine_decay_schedule(0.0, 0.02, 2, 6, 0.002)
    mask = {k: k != "norm" for k in SHAPES}
    kw = dict(beta=0.9, weight_decay=0.1, weight_decay_mask=mask, adam_b1=0.9, adam_b2=0.95,
              adam_weight_decay=0.1, consistent_rms=0.2)
    ref_tx = optax.chain(optax.clip_by_global_norm(1.0),
                         optax_muon(lr, muon_weight_dimension_numbers=DIMS, **kw))
    # adam_weight_decay_mask=None: decay every AdamW leaf, as optax does.
    our_tx = optax.chain(optax.clip_by_global_norm(1.0), muon(lr, DIMS, **kw))
    p0 = _tree(0)
    ref, ours = _run(ref_tx, p0), _run(our_tx, p0)
    for k in SHAPES:
        moved = float(jnp.max(jnp.abs(ref[k] - p0[k])))
        assert moved > 1e-3, k            # the parameters did move
        err = float(jnp.max(jnp.abs(ours[k] - ref[k]))) / moved
        print(f"4 steps {k}: max|diff|/max|param| = {_rel(ours[k], ref[k]):.2e}, "
              f"max|diff|/max|param change| = {err:.2e}")
        assert err < 1e-5, (k, err)        # relative to the change over the 4 steps
        assert _rel(ours[k], ref[k]) < 1e-6, (k, _rel(ours[k], ref[k]))


def test_make_optimizer_muon_no_decay_on_norms():
    from composer_jax.config import Optimizer, TrainConfig
    from composer_jax.train.optimizers import make_optimizer
    axes = {"layers": {"attn_norm": ("layers", "norm"), "wo": ("layers", "heads", "kv", "embed"),
                       "w": ("layers", "expert", "embed", "mlp")},
            "embed": ("vocab", "embed")}
    paths = {"layers": {"attn_norm": "layers.attn_norm", "wo": "layers.wo", "w": "layers.w"},
             "embed": "embed.embedding"}
    shapes = {"layers": {"attn_norm": (2, 8), "wo": (2, 2, 4, 8), "w": (2, 3, 8, 6)},
              "embed": (16, 8)}
    params = jax.tree.map(lambda s: jnp.ones(s), shapes, is_leaf=lambda x: isinstance(x, tuple))
    cfg = TrainConfig(optimizer=Optimizer.MUON, lr=0.1, warmup_steps=0, weight_decay=0.5)
    tx = make_optimizer(cfg, axes, paths)
    zeros = jax.tree.map(jnp.zeros_like, params)
    u, _ = tx.update(zeros, tx.init(params), params)
    np.testing.assert_array_equal(u["layers"]["attn_norm"], 0.0)        # no decay on norms
    np.testing.assert_allclose(u["embed"], -0.1 * 0.5, rtol=1e-6)       # AdamW decay
    np.testing.assert_allclose(u["layers"]["w"], -0.1 * 0.5, rtol=1e-6)  # Muon decay


SHARDED = textwrap.dedent("""
    import json
    import jax, jax.numpy as jnp, optax
    from jax.sharding import NamedSharding, PartitionSpec as P
    from optax.contrib import MuonDimensionNumbers as MDN
    from composer_jax.train.muon import muon
    mesh = jax.make_mesh((8,), ("expert",), axis_types=(jax.sharding.AxisType.Auto,))
    shape = (4, 16, 128, 96)              # [layers, expert, in, out], expert over 8 devices
    dims = {"w": MDN(2, 3)}
    tx = muon(1e-3, dims, beta=0.9, weight_decay=0.1, consistent_rms=0.2)
    res = {}
    for name, spec in (("sharded", P(None, "expert")), ("replicated", P())):
        sh = NamedSharding(mesh, spec)
        p = {"w": jax.device_put(jnp.ones(shape, jnp.float32), sh)}
        g = {"w": jax.device_put(jax.random.normal(jax.random.key(0), shape), sh)}
        st = jax.jit(tx.init)(p)
        f = jax.jit(tx.update)
        u, st2 = f(g, st, p)
        comp = f.lower(g, st, p).compile()
        m = comp.memory_analysis()
        res[name] = {"update_spec": str(u["w"].sharding.spec),
                     "mu_spec": str(st2.inner_states["muon"].inner_state[0].mu["w"].sharding.spec),
                     "temp": m.temp_size_in_bytes, "out": m.output_size_in_bytes}
        res[name + "_u"] = u["w"]
    err = float(jnp.max(jnp.abs(res["sharded_u"] - res["replicated_u"])))
    print("RESULT " + json.dumps({"sharded": res["sharded"], "replicated": res["replicated"],
                                  "err": err}))
""")


def test_muon_update_keeps_expert_sharding():
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu",
               XLA_FLAGS=os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8")
    proc = subprocess.run([sys.executable, "-c", SHARDED], capture_output=True, text=True,
                          env=env, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    import json
    r = json.loads(lines[-1][len("RESULT "):])
    sh, rep = r["sharded"], r["replicated"]
    assert "expert" in sh["update_spec"] and "expert" in sh["mu_spec"], r
    # per-device temporaries of the update: ~1/8 of the unsharded update's
    assert sh["temp"] * 4 < rep["temp"], r
    assert sh["out"] * 4 < rep["out"], r
    assert r["err"] < 1e-6, r
