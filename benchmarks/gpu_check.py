"""The prepared GPU check: kernels against the reference numerics, the train step, the engine.

GPUs cannot be compiled for without one (XLA:GPU autotunes on the device), so CI only checks that
the Triton / Mosaic-GPU kernels lower (tests/quant/test_lowering.py). On a machine with a CUDA
device (`pip install -e '.[cuda]'`) this script runs, in one process:

  1. benchmarks/quant_kernels_gpu.py: every Pallas matmul variant (hopper; blackwell on sm_100)
     timed and compared with composer_jax.quant.blockwise (max relative error per row), quantize;
  2. the `small` train step (bf16 execution) on the GPU against the same step on this host's
     CPU from the same initial weights and batch: first-step loss and gradient norm side by side,
     then `--steps` GPU steps on that batch (the loss must fall);
  3. the inference engine: greedy decoding of 4 prompts on the GPU and on the CPU (tokens equal
     up to the first divergence, reported), GPU tokens/s with and without MTP speculation.

It writes benchmarks/results/gpu_check.txt (commit it). Without a CUDA device it says so, writes
nothing and exits 0.

    python benchmarks/gpu_check.py [--steps 20] [--iters 20]
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
RESULT = ROOT / "benchmarks" / "results" / "gpu_check.txt"


def _gpu():
    import jax
    try:
        return [d for d in jax.devices() if d.platform == "gpu"]
    except RuntimeError:
        return []


def _batch(b, t, v, d, seed=0):
    import numpy as np
    rng = np.random.default_rng(seed)
    toks = rng.integers(0, v, (b, t)).astype(np.int32)
    m = np.ones((b, t), np.float32)
    m[:, -1] = 0
    mm = np.ones((b, d, t), np.float32)
    mm[:, :, -(d + 1):] = 0
    return dict(tokens=toks, positions=np.tile(np.arange(t, dtype=np.int32), (b, 1)),
                segment_ids=np.ones((b, t), np.int32), targets=np.roll(toks, -1, 1), loss_mask=m,
                mtp_targets=np.stack([np.roll(toks, -2 - k, 1) for k in range(d)], 1), mtp_mask=mm)


def train_check(steps: int) -> list[str]:
    import jax

    from composer_jax.config import Config, TrainConfig, small
    from composer_jax.config.execution import EXECUTION_PRESETS
    from composer_jax.data.config import DataConfig
    from composer_jax.train.step import build_fresh

    model = small()
    cfg = Config(model=model, execution=EXECUTION_PRESETS["bf16"](),
                 data=DataConfig(global_batch_size=8, seq_len=256),
                 train=TrainConfig(steps=1000, warmup_steps=1))
    batch = _batch(8, 256, model.vocab_size, max(model.mtp_depth, 1))
    out = {}
    for name, dev in (("cpu", jax.devices("cpu")[0]), ("gpu", _gpu()[0])):
        with jax.default_device(dev):
            fns, state = build_fresh(cfg)
            state, m = fns.train_step(state, batch)
            out[name] = (float(m["loss"]), float(m["grad_norm"]))
            if name == "gpu":
                losses, t0 = [out[name][0]], time.perf_counter()
                for _ in range(steps - 1):
                    state, m = fns.train_step(state, batch)
                    losses.append(float(m["loss"]))
                step_ms = (time.perf_counter() - t0) / max(steps - 1, 1) * 1e3
    (lc, gc), (lg, gg) = out["cpu"], out["gpu"]
    return ["train step (small, bf16, batch 8 x 256):",
            f"  first step loss cpu {lc:.5f} gpu {lg:.5f} (rel diff {abs(lg - lc) / abs(lc):.2e}); "
            f"grad_norm cpu {gc:.5f} gpu {gg:.5f}",
            f"  gpu: {steps} steps on one batch, loss {losses[0]:.4f} -> {losses[-1]:.4f} "
            f"({'falls' if losses[-1] < losses[0] else 'DOES NOT FALL'}), {step_ms:.1f} ms/step"]


def engine_check() -> list[str]:
    import jax
    import numpy as np
    from flax import nnx

    from composer_jax.config import small
    from composer_jax.inference import EngineConfig, SamplingParams
    from composer_jax.inference.timing import timed_generation, tokens_per_second
    from composer_jax.model import init_model

    cfg = small()
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(0, cfg.vocab_size, 16)] for _ in range(4)]
    params = SamplingParams(temperature=0.0, max_new_tokens=32)
    lines, toks = ["engine (small, greedy, 4 prompts of 16, 32 new tokens):"], {}
    for name, dev in (("cpu", jax.devices("cpu")[0]), ("gpu", _gpu()[0])):
        with jax.default_device(dev):
            graphdef, state = nnx.split(init_model(cfg, seed=0))
            for depth in (0, 1):
                ecfg = EngineConfig(max_batch=4, max_len=64, prefill_batch=4, spec_depth=depth)
                outs, secs, _ = timed_generation(graphdef, state, prompts, params, ecfg, repeats=2)
                toks[(name, depth)] = [list(o.tokens) for o in outs]
                lines.append(f"  {name} spec_depth={depth}: {tokens_per_second(outs, secs):,.0f} "
                             f"tokens/s")
    for depth in (0, 1):
        a, b = toks[("cpu", depth)], toks[("gpu", depth)]
        same = [next((i for i, (x, y) in enumerate(zip(p, q)) if x != y), len(p))
                for p, q in zip(a, b)]
        lines.append(f"  spec_depth={depth}: greedy tokens equal to the CPU's for the first {same} "
                     f"tokens of each prompt (f32 model; low-order differences may flip a near-tie)")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args(argv)
    if not _gpu():
        print("gpu_check: no CUDA device found; nothing run, no file written "
              "(run on a GPU machine after pip install -e '.[cuda]').")
        return 0
    import jax

    import quant_kernels_gpu
    quant_kernels_gpu.main([f"--iters={a.iters}"])
    lines = [f"# benchmarks/gpu_check.py — {time.strftime('%Y-%m-%d')}, jax {jax.__version__}, "
             f"{_gpu()[0].device_kind}, load {os.getloadavg()[0]:.1f}",
             "kernels: benchmarks/results/quant_kernels_gpu.txt (every matmul row: error vs the "
             "reference)"]
    lines += train_check(a.steps)
    lines += engine_check()
    text = "\n".join(lines)
    print(text)
    tmp = RESULT.with_suffix(".tmp")
    tmp.write_text(text + "\n")
    tmp.replace(RESULT)
    print(f"wrote {RESULT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
