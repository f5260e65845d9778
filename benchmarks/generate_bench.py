"""Generation throughput on this machine's CPU: the `small` config at batch sizes 1, 4, 16, 32,
plain decoding and MTP speculative decoding (depth 1), greedy, 16-token prompts, 32 new tokens.

Absolute times on a shared CPU are noisy, so results are printed as ratios to plain decoding at
batch 1, all measured in one run (each configuration is compiled by an identical warm-up run first; best of 3 timed runs).
The model is freshly initialised: its MTP head is untrained, so drafts are almost never accepted
and these numbers show speculation's overhead; with trained MTP heads (the pretraining issue's
`cpt_small`) the acceptance and speed-up come from `python launch.py --experiment=generate`.

    python benchmarks/generate_bench.py   # writes benchmarks/results/generate_bench.txt
"""
from __future__ import annotations

import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from composer_jax.config import small  # noqa: E402
from composer_jax.inference import EngineConfig, SamplingParams  # noqa: E402
from composer_jax.inference.timing import timed_generation, tokens_per_second  # noqa: E402
from composer_jax.model import init_model  # noqa: E402

BATCHES = (1, 4, 16, 32)
PROMPT_LEN, NEW_TOKENS, SPEC_DEPTH = 16, 32, 1
OUT = pathlib.Path(__file__).resolve().parent / "results" / "generate_bench.txt"


def main() -> None:
    cfg = small()
    model = init_model(cfg, seed=0)
    graphdef, state = nnx.split(model)
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS)
    rows = []
    for b in BATCHES:
        prompts = [[int(t) for t in rng.integers(0, cfg.vocab_size, PROMPT_LEN)] for _ in range(b)]
        base = EngineConfig(max_batch=b, max_len=PROMPT_LEN + NEW_TOKENS + SPEC_DEPTH + 2,
                            prefill_batch=b)
        for depth in (0, SPEC_DEPTH):
            ecfg = EngineConfig(**{**base.__dict__, "spec_depth": depth})
            outs, secs, eng = timed_generation(graphdef, state, prompts, params, ecfg, repeats=3)
            m = eng.speculation_metrics() if depth else {"mean_accepted_length": 1.0}
            rows.append((b, depth, tokens_per_second(outs, secs), m["mean_accepted_length"],
                         eng.stats["decode_steps"]))
            print(rows[-1], flush=True)
    ref = rows[0][2]
    plain = {b: tps for b, d, tps, _, _ in rows if d == 0}
    lines = [f"# benchmarks/generate_bench.py — {time.strftime('%Y-%m-%d')}, jax {jax.__version__}, "
             f"{jax.devices()[0].platform} x{os.cpu_count()} cores",
             f"# config small ({sum(x.size for x in jax.tree.leaves(state)):,} params), greedy, "
             f"prompt {PROMPT_LEN}, {NEW_TOKENS} new tokens; fresh (untrained) weights",
             "# ratio = tokens/s relative to plain decoding at batch 1; spec/plain at equal batch",
             f"{'batch':>5} {'decoding':>12} {'ratio_vs_b1':>12} {'spec/plain':>11} "
             f"{'mean_accepted_len':>18} {'decode_steps':>13}"]
    for b, d, tps, acc, steps_ in rows:
        name = "plain" if d == 0 else f"spec(D={d})"
        lines.append(f"{b:>5} {name:>12} {tps / ref:>12.2f} {tps / plain[b]:>11.2f} {acc:>18.3f} "
                     f"{steps_:>13}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
