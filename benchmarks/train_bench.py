"""Train-step throughput for the `small` config on this machine, measured side by side with a plain
matmul doing the same number of FLOPs (absolute times on a shared CPU are noisy; the ratio is the
point).

    python benchmarks/train_bench.py [--steps 10] [--batch 16] [--seq 256]

Prints and writes benchmarks/results/train_bench.txt: step time, tokens/s, model FLOP/s; the
achieved matmul rate (a jitted f32 matmul with the same FLOPs as one step, measured in the same run,
interleaved with the steps) and the ratio step FLOP/s / achieved matmul rate (the figure of merit);
beside it the machine's theoretical peak from lscpu (cores x FLOP/cycle x clock), never measured.
"""
from __future__ import annotations

import argparse
import os
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
from composer_jax.model.flops import flops_per_token  # noqa: E402
from composer_jax.train.mfu import cpu_theoretical_peak  # noqa: E402
from composer_jax.train.step import build_fresh  # noqa: E402


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
    fns, state = build_fresh(cfg)
    batches = [_batch(args.batch, args.seq, model_cfg.vocab_size, model_cfg.mtp_depth, i)
               for i in range(args.steps)]
    state, _ = fns.train_step(state, batches[0])          # compile
    jax.block_until_ready(state)
    tokens = args.batch * args.seq
    fpt = flops_per_token(model_cfg, args.seq)["total"]
    step_flops = fpt * tokens
    # A square f32 matmul with the same FLOPs as one train step, timed between the steps.
    n = int(round((step_flops / 2) ** (1 / 3) / 64)) * 64
    a = jnp.ones((n, n), jnp.float32)
    mm = jax.jit(lambda x: x @ x)
    mm(a).block_until_ready()
    times, mm_times = [], []
    for b in batches:
        t = time.perf_counter()
        state, m = fns.train_step(state, b)
        jax.block_until_ready(m)
        times.append(time.perf_counter() - t)
        mm_times.append(_time(lambda: mm(a), 1))
    step_s = statistics.median(times)
    mm_s = statistics.median(mm_times)
    achieved = step_flops / step_s
    mm_flops = 2 * n ** 3 / mm_s
    peak, peak_src = cpu_theoretical_peak()
    lines = [
        f"config small: {model_cfg.num_layers} layers, d={model_cfg.hidden_size}, "
        f"{model_cfg.num_routed_experts} experts top-{model_cfg.num_experts_per_tok}, MTP depth "
        f"{model_cfg.mtp_depth}, {cfg.execution.compute_dtype.value} compute; batch {args.batch} "
        f"x seq {args.seq} = {tokens} tokens/step",
        f"model FLOPs/token (training, attention included): {fpt:.4g}",
        f"train step: median {step_s * 1e3:.1f} ms over {args.steps} steps -> "
        f"{tokens / step_s:,.0f} tokens/s, {achieved / 1e9:.2f} GFLOP/s",
        f"achieved matmul rate (same-FLOPs f32 matmul {n}^3 = {2 * n ** 3 / 1e9:.2f} GFLOP, "
        f"interleaved with the steps): {mm_s * 1e3:.1f} ms -> {mm_flops / 1e9:.2f} GFLOP/s",
        f"ratio train-step FLOP/s / achieved matmul rate: {achieved / mm_flops:.3f}",
        f"theoretical peak (not measured): {peak / 1e9:.1f} GFLOP/s f32 = {peak_src}; step "
        f"FLOP/s / theoretical peak: {achieved / peak:.3f}",
        f"1-min load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs "
        f"(shared machine)",
        f"devices: {jax.devices()}",
    ]
    text = "\n".join(lines)
    print(text)
    out = pathlib.Path(__file__).parent / "results" / "train_bench.txt"
    tmp = out.with_suffix(".tmp")
    tmp.write_text(text + "\n")
    tmp.replace(out)


if __name__ == "__main__":
    main()
