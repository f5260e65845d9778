"""Is the engine's batched decode batch-invariant on this machine? One request (fixed seed) is
decoded alone in slot 0, then in other slots with other requests decoding beside it; the script
reports whether its tokens and log-probabilities are bit-identical across those placements.

    python benchmarks/engine_batch_invariance.py [--max_batch 32] [--trials 6]

Writes benchmarks/results/engine_batch_invariance.txt."""
from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flax import nnx  # noqa: E402

from composer_jax.inference.config import EngineConfig  # noqa: E402
from composer_jax.inference.engine import Engine  # noqa: E402
from composer_jax.model.transformer import Transformer  # noqa: E402
from composer_jax.protocol.params import SamplingParams  # noqa: E402
from composer_jax.rl.tasks.lookup import lookup_model_config  # noqa: E402


def run(engine_cfg: EngineConfig, model, target: list[int], others: list[list[int]],
        before: int, seed: int, n_new: int):
    """The target request's (tokens, logprobs) when `before` other requests take slots first and
    the rest arrive with it."""
    eng = Engine.from_model(model, engine_cfg)
    p = lambda s: SamplingParams(temperature=1.0, max_new_tokens=n_new, seed=s)
    for i, o in enumerate(others[:before]):
        eng.submit(o, p(1000 + i))
    rid = eng.submit(target, p(seed))
    for i, o in enumerate(others[before:]):
        eng.submit(o, p(2000 + i))
    done = eng.run()
    c = done[rid]
    return list(c.tokens), np.asarray(c.logprobs, np.float32)


def main(argv=None) -> str:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max_batch", type=int, default=32)
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--n_new", type=int, default=24)
    args = ap.parse_args(argv)
    mcfg = lookup_model_config()
    model = Transformer(mcfg, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    ecfg = EngineConfig(max_batch=args.max_batch, max_len=191, prefill_batch=1,
                        capture_router=True, seed=0)
    lines = [f"engine batch invariance: tiny_lookup model (random init), max_batch "
             f"{args.max_batch}, {args.n_new} sampled tokens at T=1, prefill_batch 1"]
    flips = diffs = 0
    for t in range(args.trials):
        target = rng.integers(3, mcfg.vocab_size, size=int(rng.integers(20, 60))).tolist()
        others = [rng.integers(3, mcfg.vocab_size, size=int(rng.integers(10, 80))).tolist()
                  for _ in range(args.max_batch - 1)]
        ref_t, ref_l = run(ecfg, model, target, [], 0, 17 + t, args.n_new)
        for before, n_others in ((3, 7), (args.max_batch - 1, args.max_batch - 1), (0, 12)):
            tok, lp = run(ecfg, model, target, others[:n_others], before, 17 + t, args.n_new)
            n = min(len(tok), len(ref_t))
            same_tok = tok == ref_t
            bit = same_tok and np.array_equal(lp.view(np.uint32), ref_l.view(np.uint32))
            maxd = float(np.max(np.abs(lp[:n] - ref_l[:n]))) if n else 0.0
            flips += not same_tok
            diffs += not bit
            lines.append(f"trial {t} slot {before:2d} with {n_others:2d} others: tokens "
                         f"{'same' if same_tok else 'DIFFER'}, logprobs "
                         f"{'bit-identical' if bit else f'differ (max |d| {maxd:.2e})'}")
    lines.append(f"placements with different tokens: {flips}; with logprobs not bit-identical: "
                 f"{diffs} (of {3 * args.trials})")
    text = "\n".join(lines) + "\n"
    out = ROOT / "benchmarks" / "results" / "engine_batch_invariance.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return text


if __name__ == "__main__":
    print(main())
