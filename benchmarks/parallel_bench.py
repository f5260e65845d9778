"""Parallelism benchmark on 8 fake CPU devices: the `cpt_small` training step.

    python benchmarks/parallel_bench.py [--steps 3] [--out benchmarks/results/parallel_bench.txt]

For each mesh preset it builds the step exactly as the training loop does
(`train.step.build_fns(model, cfg, mesh)`: the `cpt_small` experiment's loss with MTP, its
optimizer (Muon + AdamW), state and batch placed by the rules table) and prints
  - the step time as a ratio to the same step on one device (measured side by side);
  - the bytes each kind of collective moves per device per step, read from the compiled HLO
    (`parallel.hlo_stats.collective_stats`; on CPU the MoE ragged all-to-all is its padded
    worst case, so `all-to-all` is an upper bound);
  - the bytes one MoE layer's dispatch moves with the all-to-all vs an all-gather alternative
    (every expert shard gathers all tokens of its group, then reduce-scatters the outputs), for
    uniform routing: the formula, for expert = 2, 4, 8.
Fake CPU devices share the host's cores, so the ratios show the overheads of partitioning and
collectives, not accelerator speedups.
"""
import argparse
import dataclasses
import os
import sys
import time

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from composer_jax.config import MeshConfig  # noqa: E402
from composer_jax.parallel import make_mesh  # noqa: E402
from composer_jax.parallel.hlo_stats import collective_stats  # noqa: E402
from composer_jax.registry import get  # noqa: E402
from composer_jax.train.step import build_fresh  # noqa: E402

MESHES = {
    "fsdp (fsdp8)": MeshConfig(rules="fsdp"),
    "ep_fsdp (fsdp2 x expert4)": MeshConfig(fsdp=2, expert=4, rules="ep_fsdp"),
    "ep_fsdp (data2 x expert2 x tensor2)": MeshConfig(data=2, fsdp=1, expert=2, tensor=2,
                                                      rules="ep_fsdp"),
    "cp_ep (context4 x expert2, allgather)": MeshConfig(fsdp=1, context=4, expert=2, rules="cp_ep"),
    "cp_ep (context4 x expert2, ring)": MeshConfig(fsdp=1, context=4, expert=2, rules="cp_ep",
                                                   cp_attention="ring"),
}
KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")


def random_batch(cfg, seed=0) -> dict:
    b, t, v = cfg.data.global_batch_size, cfg.data.seq_len, cfg.model.vocab_size
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, v, (b, t)).astype(np.int32)
    mask = np.ones((b, t), np.float32)
    return dict(tokens=tokens, positions=np.broadcast_to(np.arange(t, dtype=np.int32), (b, t)),
                segment_ids=np.ones((b, t), np.int32), targets=np.roll(tokens, -1, 1),
                loss_mask=mask, mtp_targets=np.roll(tokens, -2, 1)[:, None],
                mtp_mask=mask[:, None])


def timed_steps(fns, state, batch, steps):
    """Seconds per train step (the state is donated, so each step feeds the next)."""
    state, m = fns.train_step(state, batch)
    jax.block_until_ready(m)
    t0 = time.perf_counter()
    for _ in range(steps):
        state, m = fns.train_step(state, batch)
    jax.block_until_ready(m)
    return (time.perf_counter() - t0) / steps, state


def collective_mib(fns, state, batch, mesh) -> dict:
    with jax.set_mesh(mesh):
        hlo = fns.train_step.jitted.lower(state, batch).compile().as_text()
    totals, _ = collective_stats(hlo)
    return {k: totals.get(k, 0) / 2**20 for k in KINDS}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    base = get("cpt_small").make_config()
    base = dataclasses.replace(base, data=dataclasses.replace(
        base.data, global_batch_size=a.batch, seq_len=a.seq))
    batch = random_batch(base)
    lines = [f"parallel_bench: cpt_small train step ({base.model.name} model, "
             f"{base.train.optimizer.value}, MTP {base.model.mtp_depth}), batch {a.batch} x seq "
             f"{a.seq}, 8 fake CPU devices on {os.cpu_count()} cores, {a.steps} timed steps",
             f"{'mesh':40s} {'ms/step':>9s} {'ratio':>6s}  collective MiB/device/step: "
             + " ".join(f"{k:>8s}" for k in ("gather", "r-scat", "a-reduce", "a2a", "permute"))]
    fns, state = build_fresh(base)
    t1, _ = timed_steps(fns, state, batch, a.steps)
    lines.append(f"{'single device':40s} {t1 * 1e3:9.1f} {1.0:6.2f}")
    print(lines[0], lines[1], lines[2], sep="\n", flush=True)
    for name, mc in MESHES.items():
        cfg = dataclasses.replace(base, mesh=mc)
        mesh = make_mesh(mc)
        fns, state = build_fresh(cfg, mesh)
        placed = fns.place_batch(batch)
        mib = collective_mib(fns, state, placed, mesh)
        t, _ = timed_steps(fns, state, placed, a.steps)
        lines.append(f"{name:40s} {t * 1e3:9.1f} {t / t1:6.2f}  " + " " * 27
                     + " ".join(f"{mib[k]:8.1f}" for k in KINDS))
        print(lines[-1], flush=True)
    # MoE dispatch traffic per MoE layer, forward, per device, bytes (bf16 activations).
    mc = base.model
    d, k, e = mc.hidden_size, mc.num_experts_per_tok, mc.num_routed_experts
    n_tokens = a.batch * a.seq
    for ep in (2, 4, 8):
        n_loc = n_tokens // 8
        a2a = 2 * n_loc * k * (ep - 1) / ep * d * 2          # there and back, expected (uniform)
        gather = (ep - 1) * n_loc * d * 2 + (ep - 1) * n_loc * d * 2  # all-gather + reduce-scatter
        lines.append(f"MoE dispatch (formula, uniform routing), expert={ep}: all-to-all "
                     f"{a2a / 2**20:.2f} MiB vs all-gather {gather / 2**20:.2f} MiB per device per "
                     f"layer (ratio {a2a / gather:.2f}; top-{k} of {e})")
        print(lines[-1], flush=True)
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
