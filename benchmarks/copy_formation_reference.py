"""Control for copy_formation.py: the same copy rows in a plain transformer, not our MLA model.

A 2-layer pre-norm transformer written out here in a few pure functions: multi-head attention
with RoPE on every query/key dim (no latent compression, no decoupled rope part), a SwiGLU MLP,
untied input and output embeddings, normal init with std 0.02. It trains on copy_formation.py's
rows (`batch`: `--length` random ids in [0, `--vocab`), then an exact repeat or spans of them) with
Adam at `--lr`, loss on the copy only, and prints the copy CE every 100 steps. If this model shows
the same plateau as `tiny` on the same rows, the plateau comes from the task and the optimiser, not
from MLA (benchmarks/results/copy_formation_reference.txt).

Shapes: B rows, T = 2 * length positions, D = --hidden, H heads of D / H dims, V = --vocab.

    python benchmarks/copy_formation_reference.py --vocab 64 --length 32 --hidden 128 --steps 1300
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from copy_formation import batch  # noqa: E402

HEADS = 4
MLP = 512


def init_params(key: jax.Array, vocab: int, hidden: int, layers: int = 2) -> dict:
    """Normal(0, 0.02) weights: embed [V, D], unembed [D, V], per layer q/k/v/o [D, D], gate/up [D, F], down [F, D]."""
    shapes = {"q": (hidden, hidden), "k": (hidden, hidden), "v": (hidden, hidden), "o": (hidden, hidden),
              "gate": (hidden, MLP), "up": (hidden, MLP), "down": (MLP, hidden)}
    keys = iter(jax.random.split(key, 2 + layers * len(shapes)))
    normal = lambda shape: 0.02 * jax.random.normal(next(keys), shape)  # noqa: E731
    return {"embed": normal((vocab, hidden)), "unembed": normal((hidden, vocab)),
            "layers": [{name: normal(shape) for name, shape in shapes.items()} for _ in range(layers)]}


def rms_norm(x: jax.Array) -> jax.Array:
    """x [..., D] scaled to unit root-mean-square over D (no learnt gain)."""
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6)


def rotate(x: jax.Array, theta: float = 10000.0) -> jax.Array:
    """RoPE (half-split pairs) on x [B, T, H, Dh] by position."""
    half = x.shape[-1] // 2
    angle = jnp.arange(x.shape[1])[:, None] / theta ** (jnp.arange(half) / half)   # [T, Dh/2]
    cos, sin = jnp.cos(angle)[None, :, None], jnp.sin(angle)[None, :, None]
    a, b = x[..., :half], x[..., half:]
    return jnp.concatenate([a * cos - b * sin, a * sin + b * cos], -1)


def forward(params: dict, ids: jax.Array) -> jax.Array:
    """Logits [B, T, V] of ids [B, T] under causal attention."""
    h = params["embed"][ids]
    B, T, D = h.shape
    causal = jnp.tril(jnp.ones((T, T), bool))
    for layer in params["layers"]:
        y = rms_norm(h)
        q, k, v = (jnp.reshape(y @ layer[n], (B, T, HEADS, D // HEADS)) for n in ("q", "k", "v"))
        scores = jnp.einsum("bqhd,bkhd->bhqk", rotate(q), rotate(k)) / np.sqrt(D // HEADS)
        weights = jax.nn.softmax(jnp.where(causal, scores, -1e9), -1)
        h = h + jnp.reshape(jnp.einsum("bhqk,bkhd->bqhd", weights, v), (B, T, D)) @ layer["o"]
        y = rms_norm(h)
        h = h + (jax.nn.silu(y @ layer["gate"]) * (y @ layer["up"])) @ layer["down"]
    return rms_norm(h) @ params["unembed"]


def copy_loss(params: dict, ids: jax.Array, length: int) -> jax.Array:
    """Mean next-id CE over the copy half (targets at positions length..T-1)."""
    logprobs = jax.nn.log_softmax(forward(params, ids)[:, :-1], -1)
    nll = -jnp.take_along_axis(logprobs, ids[:, 1:, None], -1)[..., 0]
    return nll[:, length - 1:].mean()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--length", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--steps", type=int, default=1300)
    ap.add_argument("--batch", type=int, default=32, help="rows per step")
    ap.add_argument("--copy", choices=("exact", "spans"), default="spans")
    ap.add_argument("--unique", action="store_true", help="sources without repeated ids (needs --vocab >= --length)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.hidden % (2 * HEADS) or a.batch < 1 or a.length < 8 or (a.unique and a.vocab < a.length):
        ap.error(f"need --hidden a multiple of {2 * HEADS}, --batch >= 1, --length >= 8 and, with "
                 "--unique, --vocab >= --length")
    opt = optax.adam(a.lr)
    params = init_params(jax.random.PRNGKey(a.seed), a.vocab, a.hidden)
    state = opt.init(params)

    @jax.jit
    def step(params, state, ids):
        loss, grads = jax.value_and_grad(copy_loss)(params, ids, a.length)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    print(f"plain transformer hidden {a.hidden}, {HEADS} heads, vocab {a.vocab}, {a.length} random ids + "
          f"{a.copy} copy{' (unique sources)' if a.unique else ''}, batch {a.batch}, Adam {a.lr}, seed {a.seed}; "
          f"chance ln {a.vocab} = {np.log(a.vocab):.2f}")
    rng, t0 = np.random.default_rng(a.seed), time.time()
    for i in range(1, a.steps + 1):
        ids = batch(rng, a.vocab, a.length, a.batch, a.copy == "spans", a.unique)
        params, state, loss = step(params, state, jnp.asarray(ids))
        if i % 100 == 0:
            print(f"step {i:5d}: copy CE {float(loss):.2f}   [{time.time() - t0:.0f} s]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
