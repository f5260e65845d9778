"""Run as a script in a subprocess with 8 fake CPU devices (the XLA flag must precede JAX):

    python tests/parallel/sharded_cases.py CASE [CASE ...]

Prints one JSON line per case with the max abs differences between the sharded computation and
the single-device reference (float32). tests/parallel/test_sharded.py asserts on them.
"""
import json
import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["JAX_DEFAULT_MATMUL_PRECISION"] = "highest"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from composer_jax.config import MeshConfig, tiny  # noqa: E402
from composer_jax.model import init_model  # noqa: E402
from composer_jax.model.layers import Ctx  # noqa: E402
from composer_jax.model.moe import dispatch_dense  # noqa: E402
from composer_jax.parallel import context_from_config, make_mesh  # noqa: E402
import sharded_api as api  # noqa: E402
from composer_jax.parallel.expert import dispatch_expert_parallel  # noqa: E402

# name -> (MeshConfig kwargs, what to check)
CASES = {
    "fsdp_d2f2t2": (dict(data=2, fsdp=2, tensor=2, rules="fsdp"), "grad"),
    "ep_d2e2t2_explicit": (dict(data=2, fsdp=1, expert=2, tensor=2, rules="ep_fsdp",
                                axis_type="explicit"), "grad"),
    "cp_c4e2_allgather": (dict(fsdp=1, context=4, expert=2, rules="cp_ep"), "grad"),
    "cp_f2c2e2_ring": (dict(fsdp=2, context=2, expert=2, rules="cp_ep", cp_attention="ring"),
                       "grad"),
    "ep_f2e4_train": (dict(fsdp=2, expert=4, rules="ep_fsdp"), "train"),
    "ep_dispatch_vs_dense": (dict(fsdp=2, expert=4, rules="ep_fsdp"), "moe"),
    "step_f2c2e2_chunked": (dict(fsdp=2, context=2, expert=2, rules="cp_ep"), "step"),
    # slow variants
    "ep_d2e2t2_auto": (dict(data=2, fsdp=1, expert=2, tensor=2, rules="ep_fsdp"), "grad"),
    "fsdp_f8": (dict(rules="fsdp"), "grad"),
    "cp_c2e2t2_ring_explicit": (dict(fsdp=1, context=2, expert=2, tensor=2, rules="cp_ep",
                                     cp_attention="ring", axis_type="explicit"), "grad"),
    "cp_c8_allgather": (dict(fsdp=1, context=8, rules="cp_ep"), "grad"),
}


def packed_batch(cfg, b=8, t=16, seed=0):
    """Two packed documents per row (10 + 6 tokens), positions restarting per document."""
    rng = np.random.default_rng(seed)
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (b, t)), jnp.int32)
    seg = np.repeat([[1] * 10 + [2] * 6], b, 0)
    pos = np.repeat([list(range(10)) + list(range(6))], b, 0)
    return dict(tokens=tokens, positions=jnp.asarray(pos, jnp.int32),
                segment_ids=jnp.asarray(seg, jnp.int32), targets=jnp.roll(tokens, -1, 1),
                loss_mask=jnp.asarray(rng.random((b, t)) > 0.1, jnp.float32))


def maxdiff(a, b):
    return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def check_model(mc, kind):
    cfg = tiny()
    graphdef, params = nnx.split(init_model(cfg))
    batch = packed_batch(cfg)
    pc = context_from_config(make_mesh(mc, axis_type=mc.axis_type), mc)
    ps, bs = api.state_shardings(params, pc), api.batch_shardings(batch, pc)
    if kind == "train":
        tx = api.adamw(1e-3)
        step = lambda p, o, b, pc_: api.train_step(graphdef, tx, p, o, b, pc_)  # noqa: E731
        ref = jax.jit(lambda p, o, b: step(p, o, b, None))(params, tx.init(params), batch)
        os_ = api.opt_state_shardings(tx, params, ps, pc)
        fn = api.jit_with_context(lambda p, o, b: step(p, o, b, pc), pc,
                                  in_shardings=(ps, os_, bs), out_shardings=(ps, os_, None, None))
        out = fn(api.place(params, ps), api.place(tx.init(params), os_), api.place(batch, bs))
        return {"loss": abs(float(out[2] - ref[2])), "grad_norm": abs(float(out[3] - ref[3])),
                "params": maxdiff(out[0], ref[0]),
                "param_sharded": str(out[0]["embed"][...].sharding.spec)}

    def all_of(p, b, pc_):
        lg = api.logits(graphdef, p, b, pc_)
        loss, grads = jax.value_and_grad(lambda q: api.ce_loss(graphdef, q, b, pc_))(p)
        return lg, loss, grads
    ref = jax.jit(lambda p, b: all_of(p, b, None))(params, batch)
    out = api.jit_with_context(lambda p, b: all_of(p, b, pc), pc, in_shardings=(ps, bs))(
        api.place(params, ps), api.place(batch, bs))
    return {"logits": maxdiff(out[0], ref[0]), "loss": abs(float(out[1] - ref[1])),
            "grads": maxdiff(out[2], ref[2]), "logit_scale": float(jnp.max(jnp.abs(ref[0])))}


def check_moe(mc):
    """EP all-to-all dispatch (dropless and capacity-limited) vs the dense one-hot reference."""
    cfg = tiny()
    ctx = Ctx(cfg)
    rng = np.random.default_rng(1)
    b, t, d, e, f, k = 8, 8, cfg.hidden_size, cfg.num_routed_experts, cfg.moe_intermediate_size, 2
    x = jnp.asarray(rng.normal(size=(b, t, d)), jnp.float32)
    # skewed routing: most tokens pick expert 0, so per-shard loads are very uneven
    idx = np.stack([np.where(rng.random((b, t)) < 0.7, 0, rng.integers(1, e, (b, t))),
                    rng.integers(1, e, (b, t))], -1)
    idx[..., 1] = np.where(idx[..., 1] == idx[..., 0], (idx[..., 0] + 1) % e, idx[..., 1])
    idx = jnp.asarray(idx, jnp.int32)
    w = jnp.asarray(rng.random((b, t, k)), jnp.float32)
    wg, wu = (jnp.asarray(rng.normal(size=(e, d, f)) * 0.1, jnp.float32) for _ in range(2))
    wd = jnp.asarray(rng.normal(size=(e, f, d)) * 0.1, jnp.float32)
    dense = lambda x, wg, wu, wd, w: dispatch_dense(  # noqa: E731
        x.reshape(-1, d), idx.reshape(-1, k), w.reshape(-1, k), wg, wu, wd, ctx).reshape(b, t, d)
    ref, ref_grad = jax.value_and_grad(lambda *a: jnp.sum(dense(*a) ** 2), argnums=(0, 1, 4))(
        x, wg, wu, wd, w)
    pc = context_from_config(make_mesh(mc), mc)
    res = {}
    with jax.set_mesh(pc.mesh):
        for cf in (0.0, 1.0):
            def ep(x, wg, wu, wd, w, cf=cf):
                return dispatch_expert_parallel(x, idx, w, wg, wu, wd, jnp.float32, pc, cf)

            def loss(*a, cf=cf):
                y, dropped = ep(*a, cf=cf)
                return jnp.sum(y ** 2), (y, dropped)
            (val, (y, dropped)), grad = jax.jit(jax.value_and_grad(
                loss, argnums=(0, 1, 4), has_aux=True))(x, wg, wu, wd, w)
            if cf == 0:
                res.update(out=maxdiff(y, dense(x, wg, wu, wd, w)), loss=abs(float(val - ref)),
                           grad=maxdiff(grad, ref_grad), dropped=float(dropped))
            else:
                # reference for the capacity variant: dense dispatch with dropped weights zeroed
                n_loc = b * t // pc.size("data", "fsdp", "expert")
                cap = int(np.ceil(cf * n_loc * k / e))
                keep = np.zeros((b * t, k), bool)
                flat_idx = np.asarray(idx).reshape(-1, k)
                for s in range(b * t // n_loc):
                    seen = {}
                    for n in range(s * n_loc, (s + 1) * n_loc):
                        for j in range(k):
                            ex = flat_idx[n, j]
                            seen[ex] = seen.get(ex, 0) + 1
                            keep[n, j] = seen[ex] <= cap
                wk = w * jnp.asarray(keep.reshape(b, t, k))
                res.update(cap_out=maxdiff(y, dense(x, wg, wu, wd, wk)), cap_dropped=float(dropped),
                           cap_dropped_expected=float(1 - keep.mean()))
    return res


def check_step(mc):
    """The training step itself (composer_jax.train.step) on the mesh vs one device: token-chunked
    LM-head losses, MTP self-distillation shifted across context shards, 2 microbatches, blocked
    (flash) attention over the all-gathered latent, one AdamW update."""
    from composer_jax.config import Config, ExecutionConfig, MTPLoss, Optimizer, TrainConfig
    from composer_jax.data.config import DataConfig
    from composer_jax.train.optimizers import make_optimizer
    from composer_jax.train.step import TrainState, _axes_and_paths, make_step_fns

    model_cfg = tiny()
    execution = ExecutionConfig(attention_kv_block=4, remat="full")
    cfg = Config(model=model_cfg, execution=execution,
                 data=DataConfig(global_batch_size=8, seq_len=16, vocab_size=512),
                 train=TrainConfig(steps=10, warmup_steps=0, microbatches=2, z_loss=1e-3,
                                   mtp_loss=MTPLoss.SELF_DISTILL, optimizer=Optimizer.ADAMW))
    graphdef, ps, bs = nnx.split(init_model(model_cfg, 0, execution), nnx.Param, ...)
    axes, paths = _axes_and_paths(ps)
    tx = make_optimizer(cfg.train, axes, paths)
    params, buffers = nnx.to_pure_dict(ps), nnx.to_pure_dict(bs)
    zero = jnp.zeros((), jnp.int32)
    state = TrainState(step=zero, params=params, buffers=buffers, opt_state=tx.init(params),
                       nonfinite_streak=zero, nonfinite_total=zero)
    batch = packed_batch(model_cfg)
    batch["mtp_targets"] = jnp.roll(batch["tokens"], -2, 1)[:, None]
    batch["mtp_mask"] = jnp.roll(batch["loss_mask"], -1, 1)[:, None].at[..., -2:].set(0.0)
    ref_step, _ = make_step_fns(graphdef, ps, bs, tx, cfg, None, chunk_tokens=2)
    ref_state, ref = jax.jit(ref_step)(state, batch)
    pc = context_from_config(make_mesh(mc), mc)
    step, _ = make_step_fns(graphdef, ps, bs, tx, cfg, pc, chunk_tokens=2)
    out_state, out = api.jit_with_context(step, pc)(state, batch)
    return {"loss": abs(float(out["loss"] - ref["loss"])),
            "mtp": abs(float(out["mtp_loss"] - ref["mtp_loss"])),
            "grad_norm": abs(float(out["grad_norm"] - ref["grad_norm"])),
            "params": maxdiff(out_state.params, ref_state.params),
            "mtp_scale": float(ref["mtp_loss"])}


def main(names):
    for name in names:
        kwargs, kind = CASES[name]
        mc = MeshConfig(**kwargs)
        if kind == "moe":
            res = check_moe(mc)
        elif kind == "step":
            res = check_step(mc)
        else:
            res = check_model(mc, kind)
        print("RESULT " + json.dumps({"case": name, **res}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
