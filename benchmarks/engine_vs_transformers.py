"""Our inference engine against Hugging Face transformers' `generate` on the same weights.

One DeepSeek-V3-architecture model (the `small` config, or a training run's checkpoint) is written
as a HF checkpoint by `composer_jax.model.hf.save_hf`; our engine (`composer_jax.inference`, JAX
CPU) and transformers' `DeepseekV3ForCausalLM.generate` (PyTorch CPU, float32, greedy, KV cache)
both load those files and decode the same prompts, side by side in one process, at each grid point
(batch x prompt length, 128 new tokens):

  ttft_s            time to first token: a generation of 1 new token (prefill + first sample)
  decode tok/s      (new_tokens - 1) / (time of the full generation - ttft), per stream and x batch
  greedy_same       rows whose 128 greedy tokens are identical in both systems

Before timing, a parity check compares the two implementations' logits on one sequence. Each
system runs an untimed warm-up of the same shapes first (our engine compiles each shape once).
Absolute times on a shared CPU are noisy; the ratios (engine / transformers), measured in the same
run, are what matter. Rows are appended to the results file as they finish, so a partial grid
is kept.

    PYTHONPATH=$PWD $BENCH_VENV/bin/python benchmarks/engine_vs_transformers.py \
        [--from_run=RUN_DIR] [--batches=1,8,32] [--prompts=512,2048] [--new_tokens=128]
    # BENCH_VENV: a venv with the `bench` extra; writes benchmarks/results/engine_vs_transformers.txt (torch,
    # transformers; requirements/bench.txt)
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from composer_jax.config import Config, small  # noqa: E402
from composer_jax.inference import Engine, EngineConfig, SamplingParams  # noqa: E402
from composer_jax.model.hf import load_hf, save_hf  # noqa: E402

from machine_load import uptime  # noqa: E402  (benchmarks/machine_load.py)

OUT = pathlib.Path(__file__).resolve().parent / "results" / "engine_vs_transformers.txt"
PARITY_TOL = 1e-3          # max |logit difference| allowed between the two implementations
PREFILL_TOKENS = 8192      # our engine prefills at most this many prompt tokens per call


def _import_torch():
    try:
        import torch
        import transformers
        from transformers import DeepseekV3ForCausalLM
    except ImportError as e:
        raise SystemExit(f"this benchmark needs torch and transformers ({e}); install the `bench` "
                         f"extra into a separate venv: pip install -r requirements/bench.txt")
    return torch, transformers, DeepseekV3ForCausalLM


def _model(from_run: str):
    """Our model: a training run's checkpoint (or HF dir), else a fresh `small` model (seed 0)."""
    from composer_jax.train.weights import load_weights
    cfg = Config(model=small())
    w = load_weights(from_run, cfg)
    return w.model(), (f"{from_run} (step {w.step})" if from_run else "fresh small model, seed 0")


def _prompts(batch: int, length: int, vocab: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, (batch, length)).astype(np.int64)


def parity(hf_model, torch, model) -> float:
    """Max |logits difference| of the two implementations on one 96-token sequence."""
    toks = _prompts(1, 96, model.cfg.vocab_size, 123)
    ours = np.asarray(model(jax.numpy.asarray(toks, jax.numpy.int32), with_mtp=False).logits)
    with torch.inference_mode():
        theirs = hf_model(torch.as_tensor(toks)).logits.float().numpy()
    return float(np.max(np.abs(ours - theirs)))


def run_engine(graphdef, state, prompts: np.ndarray, new_tokens: int):
    """(ttft seconds, full seconds, tokens [B, new_tokens]) after an untimed warm-up."""
    b, p = prompts.shape
    rows = max(1, min(b, PREFILL_TOKENS // p))
    cfg = EngineConfig(max_batch=b, max_len=p + new_tokens + 1, max_queue=b, prefill_batch=rows)
    plist = [[int(t) for t in row] for row in prompts]

    def once(n):
        eng = Engine(graphdef, state, cfg)
        params = SamplingParams(temperature=0.0, max_new_tokens=n)
        t0 = time.perf_counter()
        ids = [eng.submit(q, params) for q in plist]
        done = eng.run()
        return time.perf_counter() - t0, [done[i].tokens for i in ids]

    once(2)                                # compiles every shape (prefill, decode)
    ttft, _ = once(1)
    full, toks = once(new_tokens)
    return ttft, full, np.asarray(toks)


def run_hf(hf_model, torch, prompts: np.ndarray, new_tokens: int):
    """(ttft seconds, full seconds, tokens [B, new_tokens]) after an untimed warm-up."""
    ids = torch.as_tensor(prompts)
    mask = torch.ones_like(ids)

    def once(n):
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = hf_model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n,
                                    min_new_tokens=n, do_sample=False, use_cache=True,
                                    eos_token_id=None, pad_token_id=0)
        return time.perf_counter() - t0, out[:, prompts.shape[1]:].numpy()

    once(2)                                # allocator and thread pools warm
    ttft, _ = once(1)
    full, toks = once(new_tokens)
    return ttft, full, toks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--from_run", default="", help="a training run's workdir or an HF dir; "
                    "default: a fresh small model")
    ap.add_argument("--batches", default="1,32,8", help="run in this order (a partial grid keeps "
                    "the first)")
    ap.add_argument("--prompts", default="512,2048")
    ap.add_argument("--new_tokens", type=int, default=128)
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    torch, transformers, DeepseekV3ForCausalLM = _import_torch()
    batches = [int(x) for x in args.batches.split(",")]
    plens = [int(x) for x in args.prompts.split(",")]
    n = args.new_tokens

    model, source = _model(args.from_run)
    with tempfile.TemporaryDirectory() as hf_dir:
        save_hf(model, hf_dir)
        _, ours = load_hf(hf_dir)
        hf_model = DeepseekV3ForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    diff = parity(hf_model, torch, ours)
    if diff > PARITY_TOL:
        raise SystemExit(f"parity check failed: max |logits(ours) - logits(transformers)| = "
                         f"{diff:.3g} > {PARITY_TOL}; the HF export and transformers disagree")
    graphdef, state = nnx.split(ours)
    params = sum(x.size for x in jax.tree.leaves(state))
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    head = [f"# benchmarks/engine_vs_transformers.py — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
            f"jax {jax.__version__}, torch {torch.__version__}, transformers "
            f"{transformers.__version__}, cpu x{os.cpu_count()} cores, torch threads "
            f"{torch.get_num_threads()}",
            f"# model: the small config's architecture ({params:,} params), {source}; float32 both sides; "
            f"greedy; {n} new tokens; random prompt token ids (seeded)",
            f"# parity: max |logits(engine) - logits(transformers)| = {diff:.2e} on a 96-token "
            f"sequence",
            f"# load at start: {uptime()}",
            "# ratio = engine / transformers (decode: aggregate tokens/s; ttft: transformers / "
            "engine, > 1 = engine faster)",
            f"{'prompt':>6} {'batch':>5} {'system':>12} {'ttft_s':>8} {'tok/s/stream':>12} "
            f"{'tok/s_aggr':>10} {'decode_ratio':>12} {'ttft_ratio':>10} {'greedy_same':>11}"]
    out.write_text("\n".join(head) + "\n")
    print("\n".join(head), flush=True)
    for p in plens:
        for b in batches:
            prompts = _prompts(b, p, ours.cfg.vocab_size, seed=p * 1000 + b)
            e_ttft, e_full, e_toks = run_engine(graphdef, state, prompts, n)
            h_ttft, h_full, h_toks = run_hf(hf_model, torch, prompts, n)
            same = int(np.sum(np.all(e_toks == h_toks, axis=1)))
            e_dec = (n - 1) / max(e_full - e_ttft, 1e-9)
            h_dec = (n - 1) / max(h_full - h_ttft, 1e-9)
            lines = [f"{p:>6} {b:>5} {'transformers':>12} {h_ttft:>8.3f} {h_dec:>12.1f} "
                     f"{h_dec * b:>10.1f} {'':>12} {'':>10} {'':>11}",
                     f"{p:>6} {b:>5} {'engine':>12} {e_ttft:>8.3f} {e_dec:>12.1f} "
                     f"{e_dec * b:>10.1f} {e_dec / h_dec:>12.2f} {h_ttft / e_ttft:>10.2f} "
                     f"{f'{same}/{b}':>11}"]
            with out.open("a") as f:
                f.write("\n".join(lines) + "\n")
            print("\n".join(lines), flush=True)
    with out.open("a") as f:
        f.write(f"# load at end: {uptime()}\n")


if __name__ == "__main__":
    main()
