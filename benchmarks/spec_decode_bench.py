"""MTP speculative decoding on a trained model: acceptance and speed-up over plain decoding.

Loads a pretraining run whose MTP head was trained (e.g. `cpt_debug` with more steps, or
`cpt_small`), cuts prompts from held-out code (the stdlib modules in `composer_jax.heldout`, kept
out of the pretraining corpus), and decodes them greedily with the engine at each batch size, plain
(spec_depth=0) and speculative (spec_depth=d for each d in --spec_depths, at most the model's
mtp_depth: the MTP modules draft d tokens per step, the main model verifies them in one pass), side
by side in one run. Reported per batch size and depth:

  tok/s plain, tok/s spec, speed-up   end-to-end (prefill included): the fastest of --repeats
                                      runs per mode, plain and spec interleaved, after a warm-up
  acceptance                          drafts accepted / drafts proposed, per draft depth (the
                                      depth-j rate counts drafts whose earlier drafts were accepted)
  mean_accepted_len                   tokens emitted per speculative step (bonus token included)
  step_cost                           (spec seconds / spec steps) / (plain seconds / plain steps)
  greedy_same                         prompts whose greedy tokens are identical in both modes

speed-up ~= mean_accepted_len / step_cost, which says what limits it. Then, at batch 1, what a
step's device work costs by part (each part its own jitted function on the step's shapes, timed
interleaved, fastest of rounds; relative to the main model's forward over one token): the main
model over W = 1..depth+1 new tokens (a plain step's forward, a verify's), one MTP module over W
tokens (a draft pass), against a cache holding --prompt_len + --new_tokens / 2 positions.
With --cost_layers L1,L2,..: the end-to-end step cost of depth-1 speculation at batch 1 for
random-weight models of the same config with L main-model layers (whether a deeper model, where
the MTP block is a smaller share, makes a speculative step cheaper relative to a plain one).

The committed results come from two longer `cpt_debug` runs (about 10 and 13 minutes here):

    python launch.py --experiment=cpt_debug --workdir=/tmp/cpt_debug_3k --set train.steps=3000
    python launch.py --experiment=cpt_debug --workdir=/tmp/cpt_debug_3k_mtp2 \
        --set train.steps=3000 --set model.mtp_depth=2
    PYTHONPATH=$PWD python benchmarks/spec_decode_bench.py --from_run=/tmp/cpt_debug_3k
    PYTHONPATH=$PWD python benchmarks/spec_decode_bench.py --from_run=/tmp/cpt_debug_3k_mtp2 \
        --spec_depths=1,2 --out=benchmarks/results/spec_decode_bench_mtp2.txt
    PYTHONPATH=$PWD python benchmarks/spec_decode_bench.py --from_run=/tmp/cpt_debug_3k \
        --batches=1 --repeats=9 --cost_layers=3,6,12,24 \
        --out=benchmarks/results/spec_decode_cost_layers.txt
    # default --out: benchmarks/results/spec_decode_bench.txt
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import sys
import sysconfig
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from composer_jax.config import Config  # noqa: E402
from composer_jax.heldout import HELDOUT_MODULES  # noqa: E402
from composer_jax.inference.cache import init_cache  # noqa: E402
from composer_jax.inference.engine import on_device  # noqa: E402
from composer_jax.inference.forward import forward_cached, make_window, mtp_cached  # noqa: E402
from composer_jax.inference import EngineConfig, SamplingParams  # noqa: E402
from composer_jax.inference.timing import timed_generation, tokens_per_second  # noqa: E402
from composer_jax.model.params import random_model_numpy  # noqa: E402

from machine_load import uptime  # noqa: E402  (benchmarks/machine_load.py)

OUT = pathlib.Path(__file__).resolve().parent / "results" / "spec_decode_bench.txt"


def heldout_prompts(tokenizer, n: int, length: int) -> list[list[int]]:
    """n prompts of `length` tokens cut at line starts from the held-out stdlib modules' code."""
    lib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    prompts = []
    for name in sorted(HELDOUT_MODULES):
        path = lib / f"{name}.py"
        if not path.exists():
            path = lib / name / "__init__.py"
        if not path.exists():
            continue
        lines = path.read_text().splitlines(keepends=True)
        step = max(1, len(lines) // 4)
        for start in range(len(lines) // 8, len(lines), step):   # past the module docstring
            ids = tokenizer.encode("".join(lines[start:start + 60]))
            if len(ids) >= length:
                prompts.append(ids[:length])
    if len(prompts) < n:
        raise SystemExit(f"only {len(prompts)} held-out prompts of {length} tokens; lower --num_prompts")
    rng = np.random.default_rng(0)
    return [prompts[i] for i in rng.choice(len(prompts), n, replace=False)]


def step_parts(model, max_depth: int, context: int, max_len: int, rounds: int = 7,
               calls: int = 100) -> list[str]:
    """Lines of the batch-1 step-parts table (module docstring)."""
    graphdef, state = nnx.split(model)
    leaves, treedef = jax.tree.flatten(on_device(state))   # flat device arrays: no per-call
    unflat = lambda lv: jax.tree.unflatten(treedef, lv)    # noqa: E731   pytree or host copies
    dtype = model.execution.compute_dtype
    cache = init_cache(model.cfg, 1, max_len, with_mtp=True, dtype=dtype)
    starts = jnp.asarray([context], jnp.int32)
    parts = {}
    for w in range(1, max_depth + 2):
        win = make_window(starts, jnp.asarray([w], jnp.int32), w, max_len)
        toks = jnp.zeros((1, w), jnp.int32)
        fwd = jax.jit(lambda lv, c, t, win=win:
                      forward_cached(graphdef, unflat(lv), c, t, win)[0].logits)
        parts[f"main model, W={w}"] = (fwd, (leaves, cache, toks))
        if w >= 2:
            h = jnp.zeros((1, w, model.cfg.hidden_size), dtype)
            mtp = jax.jit(lambda lv, c, h, t, win=win:
                          mtp_cached(graphdef, unflat(lv), c, 0, h, t, win)[0])
            parts[f"one MTP module, W={w}"] = (mtp, (leaves, cache, h, toks))
    times = {k: [] for k in parts}
    for fn, args in parts.values():
        jax.block_until_ready(fn(*args))
    for _ in range(rounds):
        for k, (fn, args) in parts.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                r = fn(*args)
            jax.block_until_ready(r)
            times[k].append((time.perf_counter() - t0) / calls)
    base = min(times["main model, W=1"])
    return ([f"# step parts at batch 1 (device work; fastest of {rounds} interleaved rounds of "
             f"{calls} calls), context {context}:", f"{'part':<24} {'us':>8} {'x main W=1':>10}"]
            + [f"{k:<24} {min(v) * 1e6:>8.1f} {min(v) / base:>10.2f}" for k, v in times.items()])


def cost_by_layers(model, layers: list[int], prompts, params, repeats: int) -> list[str]:
    """Lines: per main-model depth, plain ms/step, depth-1 spec ms/step and their ratio."""
    lines = [f"# step cost of depth-1 speculation by main-model depth (random weights, batch 1, "
             f"fastest of {repeats} interleaved runs; ms/step includes prefill):",
             f"{'layers':>6} {'plain_ms/step':>13} {'spec_ms/step':>12} {'step_cost':>9}"]
    base = EngineConfig(max_batch=1, max_len=len(prompts[0]) + params.max_new_tokens + 4,
                        max_queue=len(prompts), prefill_batch=1)
    spec_cfg = dataclasses.replace(base, spec_depth=1)
    for n in layers:
        graphdef, state = nnx.split(random_model_numpy(
            dataclasses.replace(model.cfg, num_layers=n), std=0.05, execution=model.execution))
        runs = {"plain": [], "spec": []}
        for r in range(repeats):
            for name, ecfg in (("plain", base), ("spec", spec_cfg)):
                _, secs, eng = timed_generation(graphdef, state, prompts, params, ecfg,
                                                warmup=r == 0)
                runs[name].append(secs / eng.stats["decode_steps"])
        p, q = min(runs["plain"]), min(runs["spec"])
        lines.append(f"{n:>6} {p * 1e3:>13.3f} {q * 1e3:>12.3f} {q / p:>9.2f}")
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--from_run", required=True, help="a pretraining run's workdir (MTP trained)")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--spec_depths", default="1", help="draft depths to measure (each at most "
                    "the model's mtp_depth)")
    ap.add_argument("--num_prompts", type=int, default=8)
    ap.add_argument("--prompt_len", type=int, default=48)
    ap.add_argument("--new_tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5, help="interleaved timed runs per mode "
                    "(the fastest counts)")
    ap.add_argument("--cost_layers", default="", help="main-model depths for the step-cost "
                    "table (module docstring); empty: skip it")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()

    from composer_jax.data.tokenizer import load_tokenizer
    from composer_jax.train.weights import load_weights
    w = load_weights(args.from_run, Config())
    if w.tokenizer_path is None:
        raise SystemExit(f"{args.from_run} has no tokenizer.json: give a pretraining run's workdir")
    model = w.model()
    if model.cfg.mtp_depth < 1:
        raise SystemExit(f"{args.from_run}'s model has no MTP module (mtp_depth=0)")
    depths = [int(x) for x in args.spec_depths.split(",")]
    if not depths or min(depths) < 1 or max(depths) > model.cfg.mtp_depth:
        raise SystemExit(f"--spec_depths={args.spec_depths}: each depth must be in 1.."
                         f"{model.cfg.mtp_depth} (the model's mtp_depth)")
    tok = load_tokenizer(w.tokenizer_path)
    prompts = heldout_prompts(tok, args.num_prompts, args.prompt_len)
    graphdef, state = nnx.split(model)
    params = SamplingParams(temperature=0.0, max_new_tokens=args.new_tokens)
    out = pathlib.Path(args.out)
    head = [f"# benchmarks/spec_decode_bench.py — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
            f"jax {jax.__version__}, cpu x{os.cpu_count()} cores",
            f"# model: {args.from_run} at step {w.step} ({model.cfg.name}: hidden "
            f"{model.cfg.hidden_size}, {model.cfg.num_layers} layers, vocab {model.cfg.vocab_size}, "
            f"mtp_depth {model.cfg.mtp_depth}); greedy; {len(prompts)} held-out code prompts of "
            f"{args.prompt_len} tokens (stdlib {', '.join(sorted(HELDOUT_MODULES))}), "
            f"{args.new_tokens} new tokens; spec rows by draft depth",
            f"# load at start: {uptime()}",
            f"{'batch':>5} {'depth':>5} {'tok/s_plain':>11} {'tok/s_spec':>10} {'speed-up':>8} "
            f"{'acceptance':>12} {'mean_accepted_len':>17} {'step_cost':>9} {'greedy_same':>11}"]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(head) + "\n")
    print("\n".join(head), flush=True)
    for b in (int(x) for x in args.batches.split(",")):
        base = EngineConfig(max_batch=b, max_len=args.prompt_len + args.new_tokens + 2 * max(depths),
                            max_queue=len(prompts), prefill_batch=b)
        modes = {0: base} | {d: dataclasses.replace(base, spec_depth=d) for d in depths}
        runs = {d: [] for d in modes}
        for r in range(args.repeats):          # interleaved, the first of each untimed (compiles)
            for d, ecfg in modes.items():
                runs[d].append(timed_generation(graphdef, state, prompts, params, ecfg,
                                                warmup=r == 0))
        plain, p_secs, p_eng = min(runs[0], key=lambda x: x[1])
        p_tps = tokens_per_second(plain, p_secs)
        for d in depths:
            spec, s_secs, s_eng = min(runs[d], key=lambda x: x[1])
            m = s_eng.speculation_metrics()
            s_tps = tokens_per_second(spec, s_secs)
            cost = (s_secs / s_eng.stats["decode_steps"]) / (p_secs / p_eng.stats["decode_steps"])
            same = sum(a.tokens == c.tokens for a, c in zip(plain, spec))
            acc = "/".join(f"{x:.3f}" for x in m["acceptance_per_depth"])
            line = (f"{b:>5} {d:>5} {p_tps:>11.1f} {s_tps:>10.1f} {s_tps / p_tps:>8.2f} "
                    f"{acc:>12} {m['mean_accepted_length']:>17.3f} "
                    f"{cost:>9.2f} {f'{same}/{len(prompts)}':>11}")
            with out.open("a") as f:
                f.write(line + "\n")
            print(line, flush=True)
    parts = step_parts(model, max(depths),
                       args.prompt_len + args.new_tokens // 2,
                       args.prompt_len + args.new_tokens + 2 * max(depths))
    with out.open("a") as f:
        f.write("\n".join(parts) + "\n")
    print("\n".join(parts), flush=True)
    if args.cost_layers:
        rows = cost_by_layers(model, [int(x) for x in args.cost_layers.split(",")], prompts,
                              params, args.repeats)
        with out.open("a") as f:
            f.write("\n".join(rows) + "\n")
    sample = tok.decode(prompts[0]) + "<<" + tok.decode(plain[0].tokens) + ">>"
    with out.open("a") as f:
        f.write(f"# load at end: {uptime()}\n# sample (prompt<<greedy completion>>):\n"
                + "".join(f"#   {line}\n" for line in sample.splitlines()))


if __name__ == "__main__":
    main()
