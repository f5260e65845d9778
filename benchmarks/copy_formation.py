"""How many steps until a fresh `tiny` model copies from its context (an induction head)?

Trains the `tiny` MoE (hidden `--hidden`, no MTP) from scratch on rows of `--length` random ids in
[0, `--vocab`) followed by a copy, Adam at `--lr`, batch 32, loss on the copy only, and prints CE
per token on the first (untrained) and second half every 100 steps. `--copy exact`: the second
half repeats the first (a fixed positional offset solves it, no content matching needed);
`--copy spans`: the second half is spans of random starts (`data.copy_rows.source_then_spans`, spans of
4..length/2 ids), which only content-based copying (an induction head) predicts. A calibration
for `data.copy_rows` pretraining (benchmarks/results/rl_coding_ladder.txt, section 12).

    python benchmarks/copy_formation.py --vocab 64 --length 32 --copy spans --steps 1500
"""
from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from composer_jax.config import tiny  # noqa: E402
from composer_jax.data.copy_rows import source_then_spans  # noqa: E402
from composer_jax.model.params import init_model  # noqa: E402
from composer_jax.train.losses import target_logprobs  # noqa: E402


def batch(rng: np.random.Generator, vocab: int, length: int, rows: int, spans: bool) -> np.ndarray:
    """[rows, 2 * length] ids: random first halves, then their exact repeat or spans of them."""
    first = rng.integers(0, vocab, (rows, length)).astype(np.int32)
    if not spans:
        return np.concatenate([first, first], 1)
    return np.stack([source_then_spans(r, 2 * length, rng, 4, max(4, length // 2)) for r in first])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--length", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--copy", choices=("exact", "spans"), default="spans")
    a = ap.parse_args(argv)
    cfg = dataclasses.replace(tiny(), vocab_size=a.vocab, mtp_depth=0, hidden_size=a.hidden)
    graphdef, params, rest = nnx.split(init_model(cfg, seed=0), nnx.Param, ...)
    opt = optax.adam(a.lr)
    state = opt.init(params)
    L = a.length

    def loss_fn(params, x):
        logits = nnx.merge(graphdef, params, rest)(x, with_mtp=False).logits
        nll = -target_logprobs(logits[:, :-1], x[:, 1:])
        return nll[:, L:].mean(), (nll[:, :L - 1].mean(), nll[:, L:].mean())

    @jax.jit
    def step(params, state, x):
        (_, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, x)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, aux

    print(f"tiny hidden {a.hidden}, vocab {a.vocab}, {L} random ids + {a.copy} copy, batch 32, Adam {a.lr}; "
          f"chance ln {a.vocab} = {np.log(a.vocab):.2f}")
    rng, t0 = np.random.default_rng(0), time.time()
    for i in range(1, a.steps + 1):
        params, state, (first, second) = step(params, state, jnp.asarray(batch(rng, a.vocab, L, 32, a.copy == "spans")))
        if i % 100 == 0:
            print(f"step {i:5d}: CE first half {float(first):.2f} (untrained), second half {float(second):.2f}"
                  f"   [{time.time() - t0:.0f} s]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
