"""Where one train step's time goes, by part, on the issue-19 config (DeepSeek-V3-like, emb 256,
4 layers, 8 experts top-2 + 1 shared, fp32 weights, bf16 compute, batch 4 x 256, no MTP, AdamW).

    python benchmarks/step_parts.py [--vocab 129280 32768] [--repeats 5]

Each part is its own jitted function on the step's real shapes, timed interleaved with the others
(round-robin, median): the full train step; the same step at vocab 256 (≈ the model body + a
negligible head); the LM head + CE forward+backward, by the token-chunked autodiff path and by the
fused vocabulary-tiled path (`losses.fused_head_ce`, what the step uses on one device); the
embedding gradient as a scatter and as a one-hot matmul; the optimizer update (clip + AdamW + apply)
on the full parameter tree. Prints a table and the machine load (the CPU is shared).
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
import optax  # noqa: E402

from composer_jax.config import Config, ExecutionConfig, ModelConfig, TrainConfig  # noqa: E402
from composer_jax.data.config import DataConfig  # noqa: E402
from composer_jax.model.transformer import lm_logits  # noqa: E402
from composer_jax.train import losses  # noqa: E402
from composer_jax.train.step import build_fresh  # noqa: E402

BATCH, SEQ = 4, 256


def issue_config(vocab: int) -> Config:
    """The issue-19 model at `vocab` (MaxText: base_emb_dim=256 ... mlp_dim=moe_mlp_dim=64)."""
    model = ModelConfig(
        name=f"issue19_v{vocab}", vocab_size=vocab, hidden_size=256, num_layers=4,
        first_k_dense=1, dense_intermediate_size=64, moe_intermediate_size=64,
        num_routed_experts=8, num_shared_experts=1, num_experts_per_tok=2, num_heads=4,
        q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=128, qk_rope_head_dim=64,
        v_head_dim=128, mtp_depth=0)
    return Config(model=model, execution=ExecutionConfig(param_dtype="float32",
                                                         compute_dtype="bfloat16"),
                  data=DataConfig(global_batch_size=BATCH, seq_len=SEQ),
                  train=TrainConfig(steps=1000, warmup_steps=10))


def synthetic_batch(b: int, t: int, v: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    toks = rng.integers(0, v, (b, t)).astype(np.int32)
    mask = np.ones((b, t), np.float32)
    mask[:, -1] = 0
    return dict(tokens=toks, positions=np.tile(np.arange(t, dtype=np.int32), (b, 1)),
                segment_ids=np.ones((b, t), np.int32), targets=np.roll(toks, -1, 1),
                loss_mask=mask, mtp_targets=np.zeros((b, 0, t), np.int32),
                mtp_mask=np.zeros((b, 0, t), np.float32))


class StepRunner:
    """The real train step of `cfg` (state donated and carried from call to call)."""

    def __init__(self, cfg: Config, n_batches: int = 4):
        self.fns, self.state = build_fresh(cfg)
        v = cfg.model.vocab_size
        self.batches = [synthetic_batch(BATCH, SEQ, v, i) for i in range(n_batches)]
        self.i = 0

    def __call__(self):
        self.state, m = self.fns.train_step(self.state, self.batches[self.i % len(self.batches)])
        self.i += 1
        return m


def part_fns(cfg: Config, fns, state) -> dict:
    """name -> zero-argument callable running one jitted part on the step's shapes."""
    v, d = cfg.model.vocab_size, cfg.model.hidden_size
    n = BATCH * SEQ
    dt = jnp.bfloat16
    keys = jax.random.split(jax.random.key(1), 4)
    h = jax.random.normal(keys[0], (BATCH, SEQ, d)).astype(dt)
    w = jax.random.normal(keys[1], (d, v)) * 0.02
    tg = jax.random.randint(keys[2], (BATCH, SEQ), 0, v)
    mask = jnp.ones((BATCH, SEQ))

    def autodiff(h, w):
        return losses.ce_and_z_sums(lm_logits(h, w, dt), tg, mask)[0]

    def fused(h, w):
        return losses.fused_head_ce(h, w, tg, mask, compute_dtype=dt)[0]

    head_auto = jax.jit(jax.value_and_grad(autodiff, (0, 1)))
    head_fused = jax.jit(jax.value_and_grad(fused, (0, 1)))
    table = jax.random.normal(keys[3], (v, d))
    toks = tg.reshape(-1)
    g_rows = h.reshape(n, d).astype(jnp.float32)
    scatter = jax.jit(jax.grad(lambda e, t, g: jnp.sum(jnp.take(e, t, 0) * g)))
    # (f32: XLA:CPU 0.12 has no BF16 x BF16 = F32 kernel for this transposed-lhs layout)
    onehot = jax.jit(lambda t, g: jnp.dot(jax.nn.one_hot(t, v, dtype=jnp.float32).T, g))
    tx = fns.tx
    params = jax.tree.map(jnp.copy, state.params)      # the step donates (deletes) its state
    opt_state = jax.tree.map(jnp.copy, state.opt_state)

    def opt(p, o, g):
        g_norm = optax.global_norm(g)
        u, o = tx.update(g, o, p)
        return optax.apply_updates(p, u), o, g_norm

    opt_jit = jax.jit(opt)
    grads = jax.tree.map(lambda x: x * 1e-3, params)
    return {"LM head + CE fwd+bwd (autodiff, [N,V] logits)": lambda: head_auto(h, w),
            "LM head + CE fwd+bwd (fused, vocab-tiled)": lambda: head_fused(h, w),
            "embedding grad: scatter": lambda: scatter(table, toks, g_rows),
            "embedding grad: one-hot matmul (f32)": lambda: onehot(toks, g_rows),
            "optimizer: clip + AdamW + apply (all params)":
                lambda: opt_jit(params, opt_state, grads)}


def measure(parts: dict, repeats: int) -> dict:
    for f in parts.values():
        jax.block_until_ready(f())
    times = {k: [] for k in parts}
    for _ in range(repeats):
        for k, f in parts.items():
            t = time.perf_counter()
            jax.block_until_ready(f())
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, nargs="+", default=[129280, 32768])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    body = StepRunner(issue_config(256))
    for v in args.vocab:
        cfg = issue_config(v)
        step = StepRunner(cfg)
        parts = {"full train step": step, "train step at vocab 256 (~ body)": body}
        parts.update(part_fns(cfg, step.fns, step.state))
        res = measure(parts, args.repeats)
        full = res["full train step"]
        print(f"\nvocab {v}: batch {BATCH} x {SEQ} tokens, median of {args.repeats} interleaved "
              f"runs, load {os.getloadavg()[0]:.1f} (2 cores)")
        for k, s in res.items():
            print(f"  {k:48s} {s * 1e3:8.1f} ms  ({s / full:5.1%} of the step)")


if __name__ == "__main__":
    main()
