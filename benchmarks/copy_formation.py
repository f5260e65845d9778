"""How many steps until a fresh `tiny` model copies from its context (an induction head)?

Trains the `tiny` MoE (hidden `--hidden`, no MTP) from scratch on rows of `--length` random ids in
[0, `--vocab`) followed by a copy, Adam at `--lr`, `--batch` rows a step (default 32), loss on the
copy only, and prints CE per token on the first (untrained) and second half every 100 steps.
`--copy exact`: the second half repeats the first (a fixed positional offset solves it, no content
matching needed);
`--copy spans`: the second half is spans of random starts (`data.copy_rows.source_then_spans`, spans of
4..length/2 ids), which only content-based copying (an induction head) predicts. A calibration
for `data.copy_rows` pretraining (benchmarks/results/rl_coding_ladder.txt, sections 12 and 14).

A vocabulary curriculum (`--stages IDS:STEPS,...` with `--restrict_softmax`): rows draw their ids
from the first IDS ids of the vocabulary and the softmax covers those ids only, widening stage by
stage up to the whole vocabulary. With a 4096-id output layer the same 64-id rows that a 64-id
model learns to copy in ~700 steps show no phase change in 3000 (copy_formation_4096_64ids.txt);
restricting the softmax restores ~700 and the skill carries over as the ids widen
(copy_formation_vocab_curriculum.txt); a 32-dim KV latent (`--model kv_lora_rank=32`) ends it lower
than tiny's 16 (copy_formation_kv32.txt). copy_formation_reference.py runs the same rows in a plain
transformer, a control for the plateau.
`--copy recall`: rows of `data.recall_rows.recall_segment` (key-value records, then queries whose
value's first id follows the key 2 ids back, not the last id; `--recall_suffix N`: 0..N more ids
between key and separator), the lookup an agent's tool-call argument needs; a 2-layer model does
not learn it, the same model grown to 3 layers (`composer_jax.model.depth_growth`) does
(rl_coding_ladder.txt section 21); `--recall_pairs K` stores each record under one id of a fixed
cue pair (K pairs) and asks by the other (`paired_recall_segment`). `--save DIR` writes the model as
an HF checkpoint that `train.init_from=DIR` continues; `--probe SOURCE` measures how far a saved
model copies.

    python benchmarks/copy_formation.py --vocab 64 --length 32 --copy spans --steps 1500
    python benchmarks/copy_formation.py --vocab 4096 --length 32 --model first_k_dense=2 --restrict_softmax \
        --stages 64:1000,128:500,256:500,512:500,1024:500,2048:500,4096:1000 --save runs/induct_hf
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from composer_jax.config import Config, tiny  # noqa: E402
from composer_jax.data.copy_rows import source_then_spans  # noqa: E402
from composer_jax.data.recall_rows import IGNORED, KEY, VALUE_FIRST, VALUE_REST, recall_segment  # noqa: E402
from composer_jax.model.hf import save_hf  # noqa: E402
from composer_jax.model.params import init_model  # noqa: E402
from composer_jax.train.weights import load_weights  # noqa: E402
from composer_jax.train.losses import target_logprobs  # noqa: E402


def batch(rng: np.random.Generator, vocab: int, length: int, rows: int, spans: bool,
          unique: bool = False) -> np.ndarray:
    """[rows, 2 * length] ids: random first halves (`unique`: no id twice in a row's source, so
    every copied id has one continuation), then their exact repeat or spans of them."""
    if unique:
        first = np.stack([rng.choice(vocab, length, replace=False) for _ in range(rows)]).astype(np.int32)
    else:
        first = rng.integers(0, vocab, (rows, length)).astype(np.int32)
    if not spans:
        return np.concatenate([first, first], 1)
    return np.stack([source_then_spans(r, 2 * length, rng, 4, max(4, length // 2)) for r in first])


def previous_token_rows(rng: np.random.Generator, vocab: int, length: int, rows: int) -> np.ndarray:
    """[rows, 2 * length] ids: a random first half, then ids that repeat the id two back with
    probability 1/2 (else random): predicting x[t+1] at t needs x[t-1], i.e. a previous-token
    head, the first half of an induction circuit, which random copy rows alone do not reward."""
    x = rng.integers(0, vocab, (rows, 2 * length)).astype(np.int32)
    repeat = rng.random((rows, 2 * length)) < 0.5
    for t in range(length, 2 * length):
        x[:, t] = np.where(repeat[:, t], x[:, t - 2], x[:, t])
    return x


FIRST_ASKED = 4   # paired_recall_segment: a value's first id at the first query of its cue type


def paired_recall_segment(rng: np.random.Generator, length: int, ids: int,
                          pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A recall segment (`recall_segment`'s layout and kinds, no suffix) whose records are keyed by
    `pairs[t, 0]` and whose queries ask by `pairs[t, 1]`, for cue types t of a fixed table `pairs`
    `[K, 2]`: the query's key is not the stored one, as `"file_path": "` is not the traceback's
    `space` `/`; each pair has to be learnt once. Values and filler are random ids in [0, ids). The
    first query of each type has kind FIRST_ASKED (no earlier query of that type to match)."""
    sep = int(rng.integers(0, ids))
    tokens, kinds, stored = [], [], []
    for t in rng.permutation(len(pairs)):
        if len(tokens) >= length // 2:
            break
        value = rng.integers(0, ids, int(rng.integers(1, 5)))
        stored.append((t, value))
        filler = rng.integers(0, ids, int(rng.integers(0, 4)))
        tokens += [int(pairs[t, 0]), sep, *value.tolist(), *filler.tolist()]
        kinds += [IGNORED] * (2 + len(value) + len(filler))
    asked = set()
    while len(tokens) < length:
        t, value = stored[int(rng.integers(0, len(stored)))]
        filler = rng.integers(0, ids, int(rng.integers(0, 4)))
        tokens += [int(pairs[t, 1]), sep, *value.tolist(), *filler.tolist()]
        first = VALUE_FIRST if t in asked else FIRST_ASKED
        kinds += [IGNORED, KEY, first] + [VALUE_REST] * (len(value) - 1) + [IGNORED] * len(filler)
        asked.add(t)
    return np.asarray(tokens[:length], np.int32), np.asarray(kinds[:length], np.int8)


def probe(source: str, lengths=(32, 100, 300), rows: int = 16) -> list[str]:
    """CE per token of the model in `source` (a run workdir or an HF checkpoint) on `rows` random
    sequences of L ids (ids >= 16: no special tokens) for each L of `lengths`: the first copy,
    its exact repeat, and spans of it (random starts, 4..L/2 ids), i.e. how far it copies; then the
    CE of each recall query's first value id in `4 * rows` recall segments of S = 128 and 256 ids."""
    model = load_weights(str(pathlib.Path(source).resolve()), Config()).model()
    score = jax.jit(lambda x: -target_logprobs(model(x, with_mtp=False).logits[:, :-1], x[:, 1:]))
    vocab, rng, out = model.cfg.vocab_size, np.random.default_rng(0), []
    for L in lengths:
        src = rng.integers(16, vocab, (rows, L))
        exact = np.asarray(score(jnp.asarray(np.concatenate([src, src], 1), jnp.int32)))
        spans = np.stack([source_then_spans(r, 2 * L, rng, 4, max(4, L // 2)) for r in src])
        span_nll = np.asarray(score(jnp.asarray(spans, jnp.int32)))
        out.append(f"{source}: L={L:4d}: first copy {exact[:, :L - 1].mean():.2f}, exact repeat "
                   f"{exact[:, L:].mean():.2f}, spans {span_nll[:, L:].mean():.2f} (chance ln {vocab} = "
                   f"{np.log(vocab):.2f})")
    for S in (128, 256):   # the lookup by key (recall rows), and picking one of the stored records at random
        segments = [recall_segment(rng, S, (16, vocab)) for _ in range(4 * rows)]
        ids, kinds = np.stack([g[0] for g in segments]), np.stack([g[1] for g in segments])
        nll = np.asarray(score(jnp.asarray(ids, jnp.int32)))[kinds[:, 1:] == VALUE_FIRST]
        records = [(g[0][:int(np.argmax(g[1] == KEY))] == g[0][int(np.argmax(g[1] == VALUE_FIRST)) - 1]).sum()
                   for g in segments]
        out.append(f"{source}: recall S={S}: value first id {nll.mean():.2f} over {nll.size} queries "
                   f"(a random record of its store: ln {np.mean(records):.1f} = {np.mean(np.log(records)):.2f})")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--length", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=None, help="model width (default 64)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=32, help="rows per step")
    ap.add_argument("--copy", choices=("exact", "spans", "recall"), default="spans",
                    help="recall: rows of data.recall_rows.recall_segment (2 x LENGTH ids), loss on the "
                         "queries; prints the CE of each value's first id (the lookup) and of its other ids")
    ap.add_argument("--stages", default="",
                    help="an id curriculum, IDS:STEPS[:LENGTH],...: rows draw ids from the first IDS of --vocab "
                         "(sources of LENGTH ids, default --length) for STEPS steps, then the next stage "
                         "(replaces --steps), e.g. 64:1000,512:1000,4096:2000,4096:1000:128")
    ap.add_argument("--init", default="", help="start from the model in this run workdir or HF checkpoint "
                    "(e.g. an earlier --save) instead of a fresh tiny model; --vocab must be its vocabulary")
    ap.add_argument("--restrict_softmax", action="store_true",
                    help="normalise the output over the stage's ids only, not the whole --vocab (with --stages: a vocabulary curriculum)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the init and of the rows")
    ap.add_argument("--save", default="", help="write the trained model here as an HF checkpoint "
                    "(model.hf.save_hf; `train.init_from=DIR` starts a run from it)")
    ap.add_argument("--recall_suffix", type=int, default=0, help="--copy recall: key suffixes of 0..N ids")
    ap.add_argument("--recall_pairs", type=int, default=0,
                    help="--copy recall: K > 0 keys the records by one id of K fixed cue pairs and the queries by "
                         "the other (paired_recall_segment; the pairs are ids of the first stage)")
    ap.add_argument("--unique", action="store_true", help="sources without repeated ids (needs ids >= --length)")
    ap.add_argument("--prime", type=float, default=0.0,
                    help="share of each batch that is previous-token rows (previous_token_rows)")
    ap.add_argument("--model", action="append", default=[], metavar="FIELD=INT",
                    help="override an integer field of the tiny ModelConfig (repeatable), e.g. kv_lora_rank=64")
    ap.add_argument("--probe", default="", help="only probe the model in this run workdir or HF "
                    "checkpoint (`probe`: copying at distances 32, 100 and 300) and exit")
    a = ap.parse_args(argv)
    if a.batch < 1:
        ap.error(f"--batch must be >= 1, got {a.batch}")
    if a.probe:
        print("\n".join(probe(a.probe)))
        return 0
    if a.init and (a.model or a.hidden is not None):
        ap.error("--init takes the architecture of the model it loads: drop --model / --hidden")
    fields = {f.name for f in dataclasses.fields(tiny())}
    overrides = {}
    for item in a.model:
        name, _, value = item.partition("=")
        if name not in fields or not value.lstrip("-").isdigit():
            ap.error(f"--model {item!r}: expected FIELD=INT with FIELD one of the ModelConfig fields")
        overrides[name] = int(value)
    a.hidden = 64 if a.hidden is None else a.hidden
    if a.init:
        model = load_weights(str(pathlib.Path(a.init).resolve()), Config()).model()
        if model.cfg.vocab_size != a.vocab:
            ap.error(f"--init {a.init}: its vocabulary is {model.cfg.vocab_size} ids, --vocab is {a.vocab}")
    else:
        model = init_model(dataclasses.replace(tiny(), vocab_size=a.vocab, mtp_depth=0, hidden_size=a.hidden,
                                               **overrides), seed=a.seed)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    opt = optax.adam(a.lr)
    state = opt.init(params)
    L = a.length
    n_prime = int(round(a.prime * a.batch))
    try:
        stages = ([tuple(int(v) for v in st.split(":")) for st in a.stages.split(",")] if a.stages
                  else [(a.vocab, a.steps)])
        stages = [st if len(st) == 3 else st + (L,) for st in stages]
        if any(len(st) != 3 or not 2 <= st[0] <= a.vocab or st[1] < 1 or st[2] < 8 for st in stages):
            raise ValueError
    except ValueError:
        ap.error(f"--stages {a.stages!r}: each stage is IDS:STEPS[:LENGTH] with 2 <= IDS <= --vocab, "
                 "STEPS >= 1 and LENGTH >= 8")
    if a.unique and any(ids < length for ids, _, length in stages):
        ap.error("--unique needs at least LENGTH ids in every stage")
    plan = [(ids, length) for ids, n, length in stages for _ in range(n)]
    if a.recall_pairs and not 0 < 2 * a.recall_pairs <= stages[0][0]:
        ap.error(f"--recall_pairs {a.recall_pairs}: needs 2 x K distinct ids within the first stage's {stages[0][0]}")
    pairs = np.random.default_rng(1234).permutation(stages[0][0])[:2 * a.recall_pairs].reshape(-1, 2)

    def token_nll(params, x, ids):
        logits = nnx.merge(graphdef, params, rest)(x, with_mtp=False).logits
        if a.restrict_softmax:   # the vocabulary curriculum: the softmax over the stage's ids only
            logits = jnp.where(jnp.arange(logits.shape[-1]) < ids, logits, -1e9)
        return -target_logprobs(logits[:, :-1], x[:, 1:])

    def loss_fn(params, x, ids, L):
        nll = token_nll(params, x, ids)
        copy_rows = nll[n_prime:]
        return nll[:, L:].mean(), (copy_rows[:, :L - 1].mean(), copy_rows[:, L:].mean(),
                                   nll[:n_prime, L:].mean() if n_prime else jnp.zeros(()))

    def recall_loss_fn(params, x, kinds, ids):
        nll, kinds = token_nll(params, x, ids), kinds[:, 1:]

        def mean(mask):
            return (nll * mask).sum() / jnp.maximum(mask.sum(), 1)
        first = (kinds == VALUE_FIRST) | (kinds == FIRST_ASKED)
        return mean(kinds > 0), (mean(first), mean(kinds == VALUE_REST), mean(kinds == KEY), mean(kinds == FIRST_ASKED))

    @functools.partial(jax.jit, static_argnums=3)
    def step(params, state, x, L, ids, kinds=None):
        if kinds is not None:
            (_, aux), grads = jax.value_and_grad(recall_loss_fn, has_aux=True)(params, x, kinds, ids)
        else:
            (_, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, x, ids, L)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, aux

    start = f"from {a.init}" if a.init else f"tiny hidden {a.hidden} {overrides or ''}"
    print(f"{start}, vocab {a.vocab}, {L} random ids + {a.copy} copy, batch {a.batch}, Adam {a.lr}, seed {a.seed}; "
          f"chance ln {a.vocab} = {np.log(a.vocab):.2f}")
    rng, t0 = np.random.default_rng(a.seed), time.time()
    for i, (ids, L) in enumerate(plan, start=1):
        if a.copy == "recall":
            if a.recall_pairs:
                rows = [paired_recall_segment(rng, 2 * L, ids, pairs) for _ in range(a.batch)]
            else:
                rows = [recall_segment(rng, 2 * L, (0, ids), max_suffix=a.recall_suffix) for _ in range(a.batch)]
            x, kinds = np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])
            params, state, (first, other, key, first_asked) = step(params, state, jnp.asarray(x), L, ids,
                                                                   jnp.asarray(kinds))
            if i % 100 == 0:
                asked = f" (first query of its pair {float(first_asked):.2f})" if a.recall_pairs else ""
                print(f"step {i:5d} (ids {ids}, length {2 * L}): recall CE value first id {float(first):.2f}{asked}, "
                      f"value other ids {float(other):.2f}, key suffix {float(key):.2f}   [{time.time() - t0:.0f} s]",
                      flush=True)
            continue
        x = batch(rng, ids, L, a.batch - n_prime, a.copy == "spans", a.unique)
        if n_prime:
            x = np.concatenate([previous_token_rows(rng, ids, L, n_prime), x])
        params, state, (first, second, prime) = step(params, state, jnp.asarray(x), L, ids)
        if i % 100 == 0:
            extra = f", previous-token rows {float(prime):.2f}" if n_prime else ""
            print(f"step {i:5d} (ids {ids}, ln {np.log(ids):.2f}, length {L}): CE first half {float(first):.2f} (untrained), second half {float(second):.2f}{extra}"
                  f"   [{time.time() - t0:.0f} s]", flush=True)
    if a.save:
        save_hf(nnx.merge(graphdef, params, rest), a.save)
        print(f"saved the model as an HF checkpoint in {a.save}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
