"""Routing runs on each device's own tokens (composer_jax.parallel.per_token).

On 8 fake CPU devices (a subprocess: the XLA flag must precede JAX; this file is also the script),
for token-split meshes (Auto and Explicit axes):
  * `moe.route_local` gives the single-device chosen experts, combine weights and global expert
    loads (with and without router replay, with group-limited selection and padding);
  * neither it nor the whole model's forward + backward compiles an all-gather of a per-token
    [.., E] array (router logits / scores / choice), the planner's former 11.7 TiB per step.
"""
import json
import os
import re
import sys

import pytest
from device_subprocess import run_script

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# name -> MeshConfig kwargs; every one splits tokens over several mesh axes
MESHES = {
    "cp_f2c2e2": dict(fsdp=2, context=2, expert=2, rules="cp_ep"),
    "ep_d2e2t2_explicit": dict(data=2, fsdp=1, expert=2, tensor=2, rules="ep_fsdp",
                               axis_type="explicit"),
    "fsdp_f4c2": dict(fsdp=4, context=2, rules="fsdp"),
}
B, T = 8, 12          # 96 tokens
E, D = 10, 64         # routed experts (tiny() has 8, which is also its rope dim), model dim


def model_config():
    """tiny() with 10 experts in 2 groups (group-limited selection): no other dim is 10."""
    import dataclasses

    from composer_jax.config import tiny
    return dataclasses.replace(tiny(), num_routed_experts=E, n_group=2, topk_group=1)


def score_gathers(hlo: str, num_experts: int, model_dim: int) -> list[str]:
    """All-gather result shapes that hold a per-token [.., E] array (rank >= 2, last dim E, not
    a router weight [.., D, E])."""
    hits = []
    for line in hlo.splitlines():
        m = re.match(r"\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(.*?)\s+all-gather(?:-start)?\(", line)
        if not m:
            continue
        for dims in re.findall(r"[a-z]+[0-9]*\[([0-9,]+)\]", m.group(1)):
            shape = [int(d) for d in dims.split(",")]
            if len(shape) >= 2 and shape[-1] == num_experts and model_dim not in shape:
                hits.append(m.group(1))
    return hits


# ---------------------------------------------------------------------------------------------
# subprocess side
# ---------------------------------------------------------------------------------------------


def _routing_case(mc):
    import jax
    import jax.numpy as jnp
    import numpy as np

    from composer_jax.model.moe import route_local
    from composer_jax.parallel import context_from_config, make_mesh
    import sharded_api as api

    cfg = model_config()
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(B, T, D)), jnp.float32)
    seg = jnp.asarray(np.repeat([[1] * 7 + [2] * 3 + [0] * 2], B, 0), jnp.int32)  # with padding
    w = jnp.asarray(rng.normal(size=(D, E)) * 0.2, jnp.float32)
    bias = jnp.asarray(rng.normal(size=(E,)) * 0.1, jnp.float32)
    replay = jnp.asarray(rng.permuted(np.tile(np.arange(E), (B, T, 1)), axis=-1)[..., :2],
                         jnp.int32)
    pc = context_from_config(make_mesh(mc, axis_type=mc.axis_type), mc)
    tok = api.batch_shardings({"segment_ids": seg}, pc)["segment_ids"]
    place3 = jax.sharding.NamedSharding(pc.mesh, jax.sharding.PartitionSpec(*tok.spec, None))
    res = {}
    def routing(with_replay):
        def fn(x, seg, w, bias, rp):
            (idx, wt, _), counts = route_local(x, seg, w, bias, cfg, rp if with_replay else None)
            return idx, wt, counts
        return fn

    for name, with_replay in (("fresh", False), ("replay", True)):
        fn = routing(with_replay)
        ref = jax.jit(fn)(x, seg, w, bias, replay)
        sharded = api.jit_with_context(fn, pc)
        args = (jax.device_put(x, place3), jax.device_put(seg, tok), w, bias,
                jax.device_put(replay, place3))
        out = sharded(*args)
        with jax.set_mesh(pc.mesh):
            hlo = sharded.jitted.lower(*args).compile().as_text()
        res[name] = {"idx_equal": bool(jnp.array_equal(out[0], ref[0])),
                     "weights": float(jnp.max(jnp.abs(out[1] - ref[1]))),
                     "counts_equal": bool(jnp.array_equal(out[2], ref[2])),
                     "counts_total": int(out[2].sum()), "expected_total": int((seg != 0).sum()) * 2,
                     "score_gathers": score_gathers(hlo, E, D)}
    return res


def _model_case(mc):
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from composer_jax.model import init_model
    from composer_jax.parallel import context_from_config, make_mesh
    import sharded_api as api
    cfg = model_config()
    assert cfg.hidden_size == D
    graphdef, params = nnx.split(init_model(cfg))
    rng = np.random.default_rng(1)
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (B, T)), jnp.int32)
    seg = np.repeat([[1] * 7 + [2] * 3 + [0] * 2], B, 0)
    pos = np.repeat([list(range(7)) + list(range(3)) + [0, 0]], B, 0)
    batch = dict(tokens=tokens, positions=jnp.asarray(pos, jnp.int32),
                 segment_ids=jnp.asarray(seg, jnp.int32), targets=jnp.roll(tokens, -1, 1),
                 loss_mask=jnp.asarray(seg != 0, jnp.float32))
    pc = context_from_config(make_mesh(mc, axis_type=mc.axis_type), mc)

    def fn(p, b, pc_):
        loss, grads = jax.value_and_grad(lambda q: api.ce_loss(graphdef, q, b, pc_))(p)
        out = api._auto_body(lambda q, bb: api.forward(graphdef, q, bb, pc_)[0].expert_counts,
                             pc_, (None, None))(p, b)
        return loss, grads, out
    ref = jax.jit(lambda p, b: fn(p, b, None))(params, batch)
    ps, bs = api.state_shardings(params, pc), api.batch_shardings(batch, pc)
    sharded = api.jit_with_context(lambda p, b: fn(p, b, pc), pc, in_shardings=(ps, bs))
    args = (api.place(params, ps), api.place(batch, bs))
    out = sharded(*args)
    with jax.set_mesh(pc.mesh):
        hlo = sharded.jitted.lower(*args).compile().as_text()
    grads = max(float(jnp.max(jnp.abs(a - b))) for a, b in
                zip(jax.tree.leaves(out[1]), jax.tree.leaves(ref[1])))
    return {"loss": abs(float(out[0] - ref[0])), "grads": grads,
            "counts_equal": bool(jnp.array_equal(out[2], ref[2])),
            "score_gathers": score_gathers(hlo, E, D)}


def _main(names):
    from composer_jax.config import MeshConfig
    for name in names:
        mc = MeshConfig(**MESHES[name])
        res = {"case": name, "routing": _routing_case(mc), "model": _model_case(mc)}
        print("RESULT " + json.dumps(res), flush=True)


# ---------------------------------------------------------------------------------------------
# pytest side
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def results():
    runs = run_script(os.path.abspath(__file__), list(MESHES), cwd=ROOT)
    return {r["case"]: r for r in runs}


@pytest.mark.parametrize("mesh", list(MESHES))
def test_routing_matches_single_device(results, mesh):
    for kind, r in results[mesh]["routing"].items():
        assert r["idx_equal"] and r["counts_equal"], (kind, r)
        assert r["weights"] < 1e-6, (kind, r)
        assert r["counts_total"] == r["expected_total"], (kind, r)   # global, padding excluded


@pytest.mark.parametrize("mesh", list(MESHES))
def test_no_all_gather_of_router_scores(results, mesh):
    for kind, r in results[mesh]["routing"].items():
        assert not r["score_gathers"], (kind, r["score_gathers"])
    m = results[mesh]["model"]
    assert not m["score_gathers"], m["score_gathers"]
    assert m["counts_equal"], m
    assert m["loss"] < 2e-5 and m["grads"] < 2e-5, m


def test_score_gather_detector():
    hlo = ("  %all-gather.3 = f32[96,10]{1,0} all-gather(f32[12,10]{1,0} %p), dimensions={0}\n"
           "  %all-gather.4 = f32[64,10]{1,0} all-gather(f32[8,10]{1,0} %w), dimensions={0}\n"
           "  %ag = (f32[8,12,10]{2,1,0}) all-gather-start(f32[1,12,10]{2,1,0} %q)\n"
           "  %all-reduce.1 = f32[96,10]{1,0} all-reduce(f32[96,10]{1,0} %p), to_apply=%add\n")
    assert score_gathers(hlo, E, D) == ["f32[96,10]{1,0}", "(f32[8,12,10]{2,1,0})"]


if __name__ == "__main__":
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ["JAX_DEFAULT_MATMUL_PRECISION"] = "highest"
    sys.path.insert(0, ROOT)
    _main(sys.argv[1:])
