"""The inference engine as a shared service: decode throughput of 32 concurrent sessions (one
thread each, like 32 RL episodes on one engine) against one session, on the `small` config.

Every session is a 3-turn conversation: a 64-token prompt, then 16-token "tool results" fed into
the session's cache; each turn samples exactly 32 tokens (temperature 1). The engine runs its
background driver; sessions submit turns and block on their futures. Compared side by side:

    1 session  on an engine with max_batch=1   (the best engine for a lone session)
    1 session  on an engine with max_batch=32  (the same engine as below, mostly idle slots)
    32 sessions on an engine with max_batch=32

Each configuration runs once to compile every shape, then 3 timed runs (best kept). CPU times on
a shared machine are noisy; the ratio is the number to read.

    python benchmarks/engine_concurrency_bench.py  # writes benchmarks/results/engine_concurrency_bench.txt
"""
from __future__ import annotations

import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
from flax import nnx  # noqa: E402

from composer_jax.config import small  # noqa: E402
from composer_jax.inference import Engine, EngineConfig  # noqa: E402
from composer_jax.inference.timing import timed_sessions  # noqa: E402
from composer_jax.model import init_model  # noqa: E402

PROMPT_LEN, FEED_LEN, TURNS, NEW_TOKENS = 64, 16, 3, 32
MAX_LEN = 256
REPEATS = 3
OUT = pathlib.Path(__file__).resolve().parent / "results" / "engine_concurrency_bench.txt"


def measure(graphdef, state, vocab, sessions: int, max_batch: int) -> dict:
    cfg = EngineConfig(max_batch=max_batch, max_len=MAX_LEN, max_queue=4 * max_batch,
                       prefill_batch=min(8, max_batch))
    kw = dict(prompt_len=PROMPT_LEN, feed_len=FEED_LEN, turns=TURNS, new_tokens=NEW_TOKENS,
              vocab=vocab)
    with Engine(graphdef, state, cfg).start() as engine:
        timed_sessions(engine, sessions, seed=99, tag="warm", **kw)      # compiles every shape
        runs = [timed_sessions(engine, sessions, seed=r, tag=f"r{r}-", **kw)
                for r in range(REPEATS)]
    best = max(runs, key=lambda r: r["tokens_per_sec"])
    print(sessions, max_batch, best, flush=True)
    return best


def main() -> None:
    cfg = small()
    graphdef, state = nnx.split(init_model(cfg, seed=0))
    rows = [("1 session", 1, measure(graphdef, state, cfg.vocab_size, 1, 1)),
            ("1 session", 32, measure(graphdef, state, cfg.vocab_size, 1, 32)),
            ("32 sessions", 32, measure(graphdef, state, cfg.vocab_size, 32, 32))]
    ref = rows[0][2]["tokens_per_sec"]
    n_params = sum(x.size for x in jax.tree.leaves(state))
    lines = [f"# benchmarks/engine_concurrency_bench.py — {time.strftime('%Y-%m-%d')}, "
             f"jax {jax.__version__}, {jax.devices()[0].platform} x{os.cpu_count()} cores (shared)",
             f"# config small ({n_params:,} params, fresh weights), {TURNS}-turn sessions: prompt "
             f"{PROMPT_LEN}, fed {FEED_LEN}/turn, {NEW_TOKENS} sampled tokens/turn, temperature 1; "
             f"engine driver thread + one thread per session; best of {REPEATS} after a warm-up",
             f"{'sessions':>12} {'max_batch':>9} {'tokens':>7} {'seconds':>8} {'tokens/s':>9} "
             f"{'ratio':>6} {'decode_steps':>12}"]
    for name, mb, r in rows:
        lines.append(f"{name:>12} {mb:>9} {r['tokens']:>7} {r['seconds']:>8.2f} "
                     f"{r['tokens_per_sec']:>9.1f} {r['tokens_per_sec'] / ref:>6.2f} "
                     f"{r['decode_steps']:>12}")
    lines.append(f"# ratio = tokens/s relative to 1 session on a max_batch=1 engine; "
                 f"32 sessions / 1 session = {rows[2][2]['tokens_per_sec'] / ref:.2f}x")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
