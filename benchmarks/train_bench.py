"""Train-step throughput for the `small` config on this machine, measured side by side with a plain
matmul doing the same number of FLOPs (absolute times on a shared CPU are noisy; the ratio is the
point).

    python benchmarks/train_bench.py [--steps 10] [--batch 16] [--seq 256]

Prints and writes benchmarks/results/train_bench.txt: step time, tokens/s, model FLOP/s, MFU against
the measured peak (1024^3 f32 matmul), and achieved FLOP/s / same-FLOPs-matmul FLOP/s.
"""
from __future__ import annotations

import argparse
import dataclasses
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from composer_jax.config import Config, TrainConfig, small  # noqa: E402
from composer_jax.data.config import DataConfig  # noqa: E402
from composer_jax.model import init_model  # noqa: E402
from composer_jax.model.flops import flops_per_token  # noqa: E402
from composer_jax.train.mfu import measured_matmul_flops  # noqa: E402
from composer_jax.train.step import build  # noqa: E402


def _batch(b, t, v, d, seed):
    rng = np.random.default_rng(seed)
    toks = rng.integers(0, v, (b, t)).astype(np.int32)
    m = np.ones((b, t), np.float32)
    m[:, -1] = 0
    mm = np.ones((b, d, t), np.float32)
    mm[:, :, -(d + 1):] = 0
    return dict(tokens=toks, positions=np.tile(np.arange(t, dtype=np.int32), (b, 1)),
                segment_ids=np.ones((b, t), np.int32), targets=np.roll(toks, -1, 1), loss_mask=m,
                mtp_targets=np.stack([np.roll(toks, -2 - k, 1) for k in range(d)], 1), mtp_mask=mm)


def _time(fn, repeats):
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    args = ap.parse_args()
    model_cfg = small()
    cfg = Config(model=model_cfg, data=DataConfig(global_batch_size=args.batch, seq_len=args.seq),
                 train=TrainConfig(steps=1000, warmup_steps=10))
    fns, state = build(init_model(model_cfg), cfg)
    batches = [_batch(args.batch, args.seq, model_cfg.vocab_size, model_cfg.mtp_depth, i)
               for i in range(args.steps)]
    state, _ = fns.train_step(state, batches[0])          # compile
    jax.block_until_ready(state)
    times = []
    for b in batches:
        t = time.perf_counter()
        state, m = fns.train_step(state, b)
        jax.block_until_ready(m)
        times.append(time.perf_counter() - t)
    step_s = statistics.median(times)
    tokens = args.batch * args.seq
    fpt = flops_per_token(model_cfg, args.seq)["total"]
    step_flops = fpt * tokens
    achieved = step_flops / step_s
    # A square f32 matmul with the same FLOPs as one train step.
    n = int(round((step_flops / 2) ** (1 / 3) / 64)) * 64
    a = jnp.ones((n, n), jnp.float32)
    mm = jax.jit(lambda x: x @ x)
    mm(a).block_until_ready()
    mm_s = _time(lambda: mm(a), 5)
    mm_flops = 2 * n ** 3 / mm_s
    peak = measured_matmul_flops()
    lines = [
        f"config small: {model_cfg.num_layers} layers, d={model_cfg.hidden_size}, "
        f"{model_cfg.num_routed_experts} experts top-{model_cfg.num_experts_per_tok}, MTP depth "
        f"{model_cfg.mtp_depth}; batch {args.batch} x seq {args.seq} = {tokens} tokens/step",
        f"model FLOPs/token (training, attention included): {fpt:.4g}",
        f"train step: median {step_s * 1e3:.1f} ms over {args.steps} steps -> "
        f"{tokens / step_s:,.0f} tokens/s, {achieved / 1e9:.2f} GFLOP/s",
        f"peak (measured 1024^3 f32 matmul): {peak / 1e9:.2f} GFLOP/s -> MFU {achieved / peak:.3f}",
        f"same-FLOPs matmul ({n}^3, {2 * n ** 3 / 1e9:.2f} GFLOP): {mm_s * 1e3:.1f} ms, "
        f"{mm_flops / 1e9:.2f} GFLOP/s",
        f"ratio train-step FLOP/s / same-FLOPs matmul FLOP/s: {achieved / mm_flops:.3f}",
        f"devices: {jax.devices()}",
    ]
    text = "\n".join(lines)
    print(text)
    out = pathlib.Path(__file__).parent / "results" / "train_bench.txt"
    out.write_text(text + "\n")


if __name__ == "__main__":
    main()
