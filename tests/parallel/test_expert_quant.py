"""Expert-parallel MoE in MXFP8/NVFP4 equals the single-device quantized MoE (8 fake CPU devices).

The comparison runs in a subprocess (the XLA device-count flag must precede JAX):

    python tests/parallel/test_expert_quant.py CASE:FMT [CASE:FMT ...]     (FMT: mxfp8 | nvfp4)

prints one JSON line per case with relative differences (max |a - b| / max |b|, and relative
Frobenius norms with the suffix _fro / _vs_exact) between the expert-parallel dispatch (composer_jax.parallel.expert with the model's quantized local matmul)
and `dispatch_ragged` on one device, for the output y and the gradients of sum(y**2) with respect
to the tokens x, the routing weights and the three expert weights.

What must agree, and how closely (float32 compute; measured values in brackets):
  * y and the token / routing-weight gradients: the two paths quantize every operand of the
    forward and input-gradient GEMMs identically (MXFP8 blocks are per row / per column; NVFP4
    per-tensor scales are reduced over the mesh, `amax_axes`), so they agree to float32 summation
    order, REL_EXACT [<= 1.1e-6].
  * expert-weight gradients dW = X^T dY quantize along the token axis, in 32-row blocks (NVFP4:
    16-row blocks after a 16-row Hadamard transform) of each expert's rows, and the rows of an
    expert are split differently across devices than in the single-device sort:
      - "aligned" routing (every token shard sends each expert a multiple of 32 rows) makes the
        blocks coincide: REL_EXACT [<= 1.1e-6], also with a tensor axis;
      - "skewed" routing: MXFP8 still agrees to REL_MX_DW [1.8e-6] (power-of-two scales: only
        elements in E4M3's subnormal range, below ~3.5e-5 of their block's max, round
        differently); NVFP4's E4M3 block scales do depend on the block, so the two dW are
        different valid quantizations: within REL_NV_DW of each other (relative Frobenius)
        [0.12; 0.17 in the model case], each as close to the float32 dW as the other (NOT_WORSE) [0.25-0.29 both].
  * the whole tiny model ("model_f2e4", slow): logits, loss and every gradient but the expert
    weights' agree to REL_EXACT [<= 7.6e-7]; expert-weight gradients as for skewed routing.
  * NVFP4 with a key (stochastic rounding of gradients): the forward is unchanged (REL_EXACT);
    gradients use the same keys, but the random bits follow buffer positions, which differ
    between layouts: agreement within REL_NV_SR (relative Frobenius) [0.19] and NOT_WORSE.
"""
import json
import os
import re
import sys

import pytest
from device_subprocess import run_script

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

REL_EXACT = 1e-5      # max |a - b| / max |b|
REL_MX_DW = 1e-4      # max relative
REL_NV_DW = 0.25      # relative Frobenius
REL_NV_SR = 0.3       # relative Frobenius
NOT_WORSE = 1.1       # EP's error against the float32 gradient <= 1.1 x the single-device one
# name -> (mesh kwargs, expert width F, routing, key?)
CASES = {
    "f2e4_aligned": (dict(fsdp=2, expert=4, rules="ep_fsdp"), 32, "aligned", False),
    "f2e4_skewed": (dict(fsdp=2, expert=4, rules="ep_fsdp"), 32, "skewed", False),
    "d2e2t2_aligned": (dict(data=2, fsdp=1, expert=2, tensor=2, rules="ep_fsdp"), 64, "aligned", False),
    "f2e4_skewed_key": (dict(fsdp=2, expert=4, rules="ep_fsdp"), 32, "skewed", True),
}
B, T = 8, 64   # 8 token shards of one 64-token row each


def _routing(kind, e, rng):
    """idx [B, T, 2]: aligned = per shard (row) two 32-token halves, each half's two choices on
    two distinct experts; skewed = 70% of first choices on expert 0."""
    import numpy as np

    if kind == "aligned":
        idx = np.zeros((B, T, 2), np.int32)
        for row in range(B):
            for half in range(T // 32):
                a, c = rng.choice(e, 2, replace=False)
                idx[row, half * 32:(half + 1) * 32] = (a, c)
        return idx
    first = np.where(rng.random((B, T)) < 0.7, 0, rng.integers(1, e, (B, T)))
    second = rng.integers(1, e, (B, T))
    second = np.where(second == first, (first + 1) % e, second)
    return np.stack([first, second], -1).astype(np.int32)


def run_case(name, fmt):
    import dataclasses

    import jax
    import jax.numpy as jnp
    import numpy as np

    from composer_jax.config import ExecutionConfig, MeshConfig, tiny
    from composer_jax.model.layers import Ctx
    from composer_jax.model.moe import dispatch_ragged, expert_parallel_codec, expert_parallel_matmul
    from composer_jax.parallel import context_from_config, make_mesh
    from composer_jax.parallel.expert import dispatch_expert_parallel

    mesh_kw, f, routing, with_key = CASES[name]
    cfg = dataclasses.replace(tiny(), moe_intermediate_size=f)
    ctx = Ctx(cfg, ExecutionConfig(precision=fmt), key=jax.random.PRNGKey(7) if with_key else None)
    rng = np.random.default_rng(3)
    d, e, k = cfg.hidden_size, cfg.num_routed_experts, 2
    x = jnp.asarray(rng.normal(size=(B, T, d)), jnp.float32)
    idx = jnp.asarray(_routing(routing, e, rng))
    w = jnp.asarray(rng.random((B, T, k)), jnp.float32)
    wg, wu = (jnp.asarray(rng.normal(size=(e, d, f)) * 0.1, jnp.float32) for _ in range(2))
    wd = jnp.asarray(rng.normal(size=(e, f, d)) * 0.1, jnp.float32)
    args = (x, w, wg, wu, wd)

    def single(x, w, wg, wu, wd, ctx=ctx):
        y = dispatch_ragged(x.reshape(-1, d), idx.reshape(-1, k), w.reshape(-1, k), wg, wu, wd, ctx)
        return y.reshape(B, T, d)

    def value_and_grads(fn):
        return jax.jit(jax.value_and_grad(lambda *a: jnp.sum(fn(*a) ** 2), argnums=tuple(range(5))))

    _, ref_g = value_and_grads(single)(*args)
    ref_y = jax.jit(single)(*args)
    _, exact_g = value_and_grads(lambda *a: single(*a, ctx=Ctx(cfg)))(*args)   # bf16 recipe
    mc = MeshConfig(**mesh_kw)
    pc = context_from_config(make_mesh(mc), mc)

    def ep(x, w, wg, wu, wd):
        y, _ = dispatch_expert_parallel(x, idx, w, wg, wu, wd, jnp.float32, pc, 0.0,
                                        grouped=expert_parallel_matmul(ctx),
                                        codec=expert_parallel_codec(ctx, d))
        return y

    with jax.set_mesh(pc.mesh):
        y = jax.jit(ep)(*args)
        _, g = value_and_grads(ep)(*args)
    rel = lambda a, b: float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))  # noqa: E731
    fro = lambda a, b: float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))  # noqa: E731
    names = ("x", "weights", "w_gate", "w_up", "w_down")
    res = {"case": name, "fmt": fmt, "y": rel(y, ref_y)}
    res.update({f"d_{n}": rel(a, b) for n, a, b in zip(names, g, ref_g)})
    res.update({f"d_{n}_fro": fro(a, b) for n, a, b in zip(names, g, ref_g)})
    res.update({f"d_{n}_vs_exact": fro(a, b) for n, a, b in zip(names, g, exact_g)})
    res.update({f"ref_d_{n}_vs_exact": fro(a, b) for n, a, b in zip(names, ref_g, exact_g)})
    return res


def run_model_case(fmt):
    """The whole tiny model (ep_fsdp, fsdp=2 x expert=4) vs one device: logits, loss, gradients."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from composer_jax.config import ExecutionConfig, MeshConfig, tiny
    from composer_jax.model import init_model
    from composer_jax.parallel import context_from_config, make_mesh
    import sharded_api as api
    from sharded_cases import packed_batch

    cfg = tiny()
    graphdef, params = nnx.split(init_model(cfg, 0, ExecutionConfig(precision=fmt)))
    batch = packed_batch(cfg)
    mc = MeshConfig(fsdp=2, expert=4, rules="ep_fsdp")
    pc = context_from_config(make_mesh(mc), mc)
    ps, bs = api.state_shardings(params, pc), api.batch_shardings(batch, pc)

    def all_of(p, b, pc_):
        loss, grads = jax.value_and_grad(lambda q: api.ce_loss(graphdef, q, b, pc_))(p)
        return api.logits(graphdef, p, b, pc_), loss, grads

    ref = jax.jit(lambda p, b: all_of(p, b, None))(params, batch)
    out = api.jit_with_context(lambda p, b: all_of(p, b, pc), pc, in_shardings=(ps, bs))(
        api.place(params, ps), api.place(batch, bs))
    rel = lambda a, b: float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))  # noqa: E731
    fro = lambda a, b: float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))  # noqa: E731
    res = {"case": "model_f2e4", "fmt": fmt, "logits": rel(out[0], ref[0]),
           "loss": abs(float(out[1] - ref[1])), "other_grads": 0.0, "expert_grads": 0.0,
           "expert_grads_fro": 0.0}
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(out[2])[0], jax.tree.leaves(ref[2])):
        if re.search(r"\['ffn'\]\['w_(gate|up|down)'\]", jax.tree_util.keystr(path)):  # routed experts
            res["expert_grads"] = max(res["expert_grads"], rel(a, b))
            res["expert_grads_fro"] = max(res["expert_grads_fro"], fro(a, b))
        else:
            res["other_grads"] = max(res["other_grads"], rel(a, b))
    return res


def main(names):
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ["JAX_DEFAULT_MATMUL_PRECISION"] = "highest"
    sys.path[:0] = [ROOT, HERE]
    for spec in names:
        name, fmt = spec.split(":")
        res = run_model_case(fmt) if name == "model_f2e4" else run_case(name, fmt)
        print("RESULT " + json.dumps(res), flush=True)


def run_cases(specs):
    return run_script(os.path.abspath(__file__), specs)


WEIGHTS = ("d_w_gate", "d_w_up", "d_w_down")


def not_worse(r, names):
    return all(r[n + "_vs_exact"] <= NOT_WORSE * r["ref_" + n + "_vs_exact"] for n in names)


def check(r):
    fmt, name = r["fmt"], r["case"]
    if name == "model_f2e4":  # only the expert-weight gradients see different token blocks
        assert r["logits"] < REL_EXACT and r["loss"] < REL_EXACT and r["other_grads"] < REL_EXACT, r
        assert (r["expert_grads"] < REL_MX_DW if fmt == "mxfp8" else r["expert_grads_fro"] < REL_NV_DW), r
        return
    assert r["y"] < REL_EXACT, r
    if name.endswith("_key"):
        grads = ("d_x", "d_weights") + WEIGHTS
        assert all(r[n + "_fro"] < REL_NV_SR for n in grads) and not_worse(r, grads), r
        return
    assert r["d_x"] < REL_EXACT and r["d_weights"] < REL_EXACT, r
    if "aligned" in name:
        assert all(r[n] < REL_EXACT for n in WEIGHTS), r
    elif fmt == "mxfp8":
        assert all(r[n] < REL_MX_DW for n in WEIGHTS), r
    else:
        assert all(r[n + "_fro"] < REL_NV_DW for n in WEIGHTS) and not_worse(r, WEIGHTS), r


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_expert_parallel_quantized_moe_matches_single_device(fmt):
    for r in run_cases([f"d2e2t2_aligned:{fmt}", f"f2e4_skewed:{fmt}"]):
        check(r)


@pytest.mark.slow
def test_expert_parallel_quantized_moe_more_cases():
    for r in run_cases(["f2e4_aligned:mxfp8", "f2e4_aligned:nvfp4", "f2e4_skewed_key:nvfp4",
                        "model_f2e4:mxfp8", "model_f2e4:nvfp4"]):
        check(r)


if __name__ == "__main__":
    main(sys.argv[1:])
