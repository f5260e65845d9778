"""Parallelism benchmark on 8 fake CPU devices (the `small` config).

    python benchmarks/parallel_bench.py [--steps 3] [--out benchmarks/results/parallel_bench.txt]

Prints each preset's train-step time (loss + grad + AdamW) as a ratio to the single-device step,
and the bytes the MoE all-to-all dispatch moves per MoE layer compared with an all-gather
alternative (every expert shard gathers all tokens of its group). Fake CPU devices share the
host's cores, so ratios show overheads of partitioning and collectives, not accelerator speedups.
"""
import argparse
import os
import sys
import time

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from composer_jax.config import MeshConfig, small  # noqa: E402
from composer_jax.model import init_model  # noqa: E402
from composer_jax.parallel import api, context_from_config, make_mesh  # noqa: E402

MESHES = {
    "fsdp (fsdp8)": MeshConfig(rules="fsdp"),
    "ep_fsdp (fsdp2 x expert4)": MeshConfig(fsdp=2, expert=4, rules="ep_fsdp"),
    "ep_fsdp (data2 x expert2 x tensor2)": MeshConfig(data=2, fsdp=1, expert=2, tensor=2,
                                                      rules="ep_fsdp"),
    "cp_ep (context4 x expert2, allgather)": MeshConfig(fsdp=1, context=4, expert=2, rules="cp_ep"),
    "cp_ep (context4 x expert2, ring)": MeshConfig(fsdp=1, context=4, expert=2, rules="cp_ep",
                                                   cp_attention="ring"),
}


def timed(fn, args, steps):
    out = fn(*args)
    jax.block_until_ready(out)
    t0 = time.perf_counter()
    for _ in range(steps):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    cfg = small()
    graphdef, params = nnx.split(init_model(cfg))
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (a.batch, a.seq)), jnp.int32)
    batch = dict(tokens=tokens, positions=jnp.broadcast_to(jnp.arange(a.seq), tokens.shape),
                 segment_ids=jnp.ones_like(tokens), targets=jnp.roll(tokens, -1, 1),
                 loss_mask=jnp.ones(tokens.shape, jnp.float32))
    tx = api.adamw()
    lines = [f"parallel_bench: small config, batch {a.batch} x seq {a.seq}, 8 fake CPU devices "
             f"on {os.cpu_count()} cores, {a.steps} timed steps"]
    single = jax.jit(lambda p, o, b: api.train_step(graphdef, tx, p, o, b))
    t1 = timed(single, (params, tx.init(params), batch), a.steps)
    lines.append(f"{'single device':40s} {t1 * 1e3:9.1f} ms/step  ratio 1.00")
    for name, mc in MESHES.items():
        pc = context_from_config(make_mesh(mc), mc)
        ps, bs = api.state_shardings(params, pc), api.batch_shardings(batch, pc)
        os_ = api.opt_state_shardings(tx, params, ps, pc)
        fn = api.jit_with_context(lambda p, o, b, pc=pc: api.train_step(graphdef, tx, p, o, b, pc),
                                  pc, in_shardings=(ps, os_, bs), out_shardings=(ps, os_, None, None))
        t = timed(fn, (api.place(params, ps), api.place(tx.init(params), os_), api.place(batch, bs)),
                  a.steps)
        lines.append(f"{name:40s} {t * 1e3:9.1f} ms/step  ratio {t / t1:.2f}")
    # MoE dispatch traffic per MoE layer, forward, per device, bytes (bf16 activations).
    d, k, e = cfg.hidden_size, cfg.num_experts_per_tok, cfg.num_routed_experts
    n_tokens = a.batch * a.seq
    for ep in (2, 4, 8):
        n_loc = n_tokens // 8
        a2a = 2 * n_loc * k * (ep - 1) / ep * d * 2          # there and back, expected (uniform)
        gather = (ep - 1) * n_loc * d * 2 + (ep - 1) * n_loc * d * 2  # all-gather + reduce-scatter
        lines.append(f"MoE dispatch, expert={ep}: all-to-all {a2a / 2**20:.2f} MiB vs all-gather "
                     f"{gather / 2**20:.2f} MiB per device per layer (ratio {a2a / gather:.2f}; "
                     f"top-{k} of {e})")
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
