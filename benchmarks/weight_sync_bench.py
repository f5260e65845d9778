"""Weight-sync benchmark: how small are lossless bf16 deltas between RL-sized training steps?

    COMPOSER_JAX_CACHE=.cache python benchmarks/weight_sync_bench.py [--versions 20] [--batch 8]
        [--warm_steps 40] [--threads 1]

The `small` model (fp32 master weights) is first trained briefly on real code tokens (the local
corpus of `cpt_small`, `--warm_steps` steps of Muon at lr 2e-3), so the RL runs start from trained
rather than freshly initialised weights. From that state, four runs side by side -- AdamW and Muon
(the project's optimizers, composer_jax/train/optimizers.py) at lr 1e-6 and 1e-5, constant
schedule, fresh optimizer state, the project's train step with its real CE (+MTP) loss on real
token batches -- each take `--versions` steps; after every step the fp32 master is published to a
weight store (bf16 inference copy) and read back by a reader that holds the previous version.

Per version: the fraction of bf16 values whose bit pattern changed, the delta's bytes and
weight_sync_ratio = full bf16 size / delta bytes (sparse codec; XOR codec alongside), publish
(encode) and fetch (decode) time, against a plain host copy of the full bf16 weights. Every fetched
version is checked bit for bit against the trainer's own bf16 cast. Writes
benchmarks/results/weight_sync_bench.txt.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

from composer_jax import data  # noqa: E402
from composer_jax.config import Config, Optimizer, Schedule, TrainConfig, small  # noqa: E402
from composer_jax.data.config import DataConfig  # noqa: E402
from composer_jax.model import init_model  # noqa: E402
from composer_jax.rl.weights import (MemoryTransport, WeightReader, WeightStore,  # noqa: E402
                                     WeightSyncSettings, publishable)
from composer_jax.rl.weights.store import flatten  # noqa: E402
from composer_jax.train.step import build  # noqa: E402

RUNS = [("adamw", 1e-6), ("muon", 1e-6), ("adamw", 1e-5), ("muon", 1e-5)]


def _host(tree):
    return jax.tree.map(np.asarray, tree)


def _expected(shipped_tree) -> dict:
    out = {}
    for k, x in flatten(shipped_tree).items():
        x = np.asarray(x)
        out[k] = x if k.endswith("bias") else x.astype(ml_dtypes.bfloat16)
    return out


def _time_copy(arrays: dict, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        _ = {k: np.array(v, copy=True) for k, v in arrays.items()}
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def run_one(opt: str, lr: float, warm_model, batches, args) -> dict:
    cfg = Config(model=small(), data=DataConfig(vocab_size=4096, seq_len=args.seq,
                                                global_batch_size=args.batch),
                 train=TrainConfig(steps=10_000, lr=lr, warmup_steps=0, schedule=Schedule.CONSTANT,
                                   optimizer=Optimizer(opt), grad_clip=1.0))
    fns, state = build(warm_model(), cfg)
    settings = WeightSyncSettings(full_snapshot_every=args.snapshot_every, threads=args.threads)
    store = WeightStore(MemoryTransport(), settings, reader_name=None)
    xor_store = WeightStore(MemoryTransport(), dataclasses.replace(settings, codec="xor"),
                            reader_name=None)
    reader = WeightReader(store.transport, "engine")
    rows = []
    s0 = store.publish(0, publishable(state.params, state.buffers))
    xor_store.publish(0, publishable(state.params, state.buffers))
    got = reader.fetch(0)
    full_copy_s = _time_copy(got)
    for v in range(1, args.versions + 1):
        state, metrics = fns.train_step(state, batches[(v - 1) % len(batches)])
        jax.block_until_ready(state)
        tree = publishable(state.params, state.buffers)
        st = store.publish(v, tree)
        xs = xor_store.publish(v, tree)
        t = time.perf_counter()
        got = reader.fetch(v)
        dec_s = time.perf_counter() - t
        want = _expected(_host(tree))
        exact = all(np.array_equal(got[k].reshape(-1).view(np.uint8),
                                   want[k].reshape(-1).view(np.uint8)) for k in want)
        assert exact, f"version {v} of {opt}@{lr} is not bit-exact"
        rows.append(dict(v=v, changed=st.changed_fraction, bytes=st.bytes, xor_bytes=xs.bytes,
                         stored=st.stored_bytes, raw=st.raw_bytes, ratio=st.ratio, enc=st.seconds, dec=dec_s,
                         loss=float(metrics["loss"]), kind=st.kind))
    # Full snapshot cost (zstd of the whole bf16 copy) for the amortised ratio and as a reference.
    snap = WeightStore(MemoryTransport(), settings, reader_name=None)
    fs = snap.publish(0, publishable(state.params, state.buffers))
    t = time.perf_counter()
    WeightReader(snap.transport).fetch(0)
    snap_dec = time.perf_counter() - t
    return dict(opt=opt, lr=lr, rows=rows, full_copy_s=full_copy_s, snapshot_bytes=fs.bytes,
                snapshot_enc=fs.seconds, snapshot_dec=snap_dec, raw=s0.raw_bytes)


def stored_ratio(r: dict) -> float:
    """Full size x versions / everything stored (deltas + the scheduled snapshots)."""
    return sum(x["raw"] for x in r["rows"]) / sum(x["stored"] for x in r["rows"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--versions", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--warm_steps", type=int, default=40)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--snapshot_every", type=int, default=10)
    ap.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results" /
                                         "weight_sync_bench.txt"))
    ap.add_argument("--raw_json", default="", help="also dump the raw per-version numbers here")
    ap.add_argument("--from_json", default="", help="only re-render a --raw_json dump")
    args = ap.parse_args()
    t_start = time.time()
    if args.from_json:
        dump = json.loads(pathlib.Path(args.from_json).read_text())
        text = render(dump["results"], args, dump["meta"])
        print(text)
        pathlib.Path(args.out).write_text(text + "\n")
        return

    dcfg = DataConfig(vocab_size=4096, seq_len=args.seq, global_batch_size=args.batch)
    corpus = data.build_or_load_corpus(dcfg)
    tok = data.build_or_load_tokenizer(dcfg, corpus, 4096)
    it = data.make_train_iterator(dcfg, tok, small().mtp_depth, 0, 1, corpus=corpus)
    n_batches = args.warm_steps + args.versions
    batches = [dict(next(it)) for _ in range(n_batches)]
    warm, rl_batches = batches[:args.warm_steps], batches[args.warm_steps:]

    # Warm start: a short CPT phase (cpt_small's optimizer and lr) so the weights are trained.
    wcfg = Config(model=small(), data=dcfg,
                  train=TrainConfig(steps=max(args.warm_steps, 1), lr=2e-3,
                                    warmup_steps=min(10, args.warm_steps), optimizer=Optimizer.MUON))
    fns, state = build(init_model(small()), wcfg)
    loss0 = None
    for b in warm:
        state, m = fns.train_step(state, b)
        loss0 = loss0 if loss0 is not None else float(m["loss"])
    warm_loss = float(m["loss"]) if warm else float("nan")
    # Host copies: the train step donates its state, each run builds its model from these.
    warm_params, warm_buffers = _host(state.params), _host(state.buffers)
    warm_model = lambda: fns.merge(jax.tree.map(jax.numpy.asarray, warm_params),  # noqa: E731
                                   jax.tree.map(jax.numpy.asarray, warm_buffers))
    print(f"warm start: {args.warm_steps} steps, loss {loss0} -> {warm_loss:.3f}", flush=True)

    results = []
    for opt, lr in RUNS:
        r = run_one(opt, lr, warm_model, rl_batches, args)
        results.append(r)
        rs = r["rows"]
        print(f"{opt}@{lr:g}: changed {statistics.mean(x['changed'] for x in rs):.4%}, ratio "
              f"median {statistics.median(x['ratio'] for x in rs):.1f}x", flush=True)

    meta = dict(loss0=loss0, warm_loss=warm_loss, wall=time.time() - t_start,
                n_params=sum(int(np.prod(np.shape(x))) for x in flatten(state.params).values()))
    if args.raw_json:
        pathlib.Path(args.raw_json).write_text(json.dumps({"results": results, "meta": meta}))
    text = render(results, args, meta)
    print(text)
    pathlib.Path(args.out).write_text(text + "\n")


def render(results: list[dict], args, meta: dict) -> str:
    """The results file's text."""
    loss0, warm_loss, n_params = meta["loss0"], meta["warm_loss"], meta["n_params"]
    k = args.snapshot_every
    raw = results[0]["raw"]
    lines = [
        "Weight sync: lossless bf16 deltas between RL steps (benchmarks/weight_sync_bench.py)",
        f"model: small ({n_params:,} parameters, fp32 master; inference copy bf16 = {raw:,} bytes, "
        f"router biases kept fp32)",
        f"data: real code tokens (cpt_small corpus), batch {args.batch} x {args.seq}; project train "
        f"step (CE + MTP loss), grad clip 1.0, weight decay 0.1, constant lr, fresh optimizer state",
        f"warm start: {args.warm_steps} Muon steps at lr 2e-3 from init, loss {loss0:.3f} -> "
        f"{warm_loss:.3f}; then {args.versions} versions per run",
        f"codec: changed positions (gaps) + XOR of changed values, byte planes, zstd level 3, chunks "
        f"of 2^20 elements, blake2b checksum per shard; {args.threads} encode/decode thread(s); "
        f"every fetched version verified bit-exact",
        "",
        "Summary (per-version medians over the run; ratio = full bf16 size / bytes sent)",
        f"{'run':<14}{'changed':>9}{'delta KiB':>11}{'ratio':>8}{'min':>8}{'xor':>8}"
        f"{'stored':>9}{'enc ms':>9}{'dec ms':>9}{'copy ms':>9}"
        f"{'snap enc':>10}{'snap dec':>10}",
    ]
    for r in results:
        rs = r["rows"]
        med = lambda f: statistics.median(f(x) for x in rs)  # noqa: E731
        lines.append(
            f"{r['opt'] + '@' + format(r['lr'], 'g'):<14}{med(lambda x: x['changed']):>9.3%}"
            f"{med(lambda x: x['bytes']) / 1024:>11.1f}{med(lambda x: x['ratio']):>7.1f}x"
            f"{min(x['ratio'] for x in rs):>7.1f}x{med(lambda x: x['raw'] / x['xor_bytes']):>7.1f}x"
            f"{stored_ratio(r):>8.1f}x{med(lambda x: x['enc']) * 1e3:>9.1f}"
            f"{med(lambda x: x['dec']) * 1e3:>9.1f}{r['full_copy_s'] * 1e3:>9.1f}"
            f"{r['snapshot_enc'] * 1e3:>10.1f}{r['snapshot_dec'] * 1e3:>10.1f}")
    lines += ["", f"full snapshot (zstd of the bf16 copy): {results[-1]['snapshot_bytes']:,} bytes "
              f"= {raw / results[-1]['snapshot_bytes']:.2f}x; 'copy' = a plain host copy of the full "
              f"bf16 weights; enc = publish (cast, diff, compress, checksum), dec = fetch by a reader "
              f"holding the previous version (decompress, apply, checksum)",
              f"snapshots every {k} versions (rl.full_snapshot_every) carry the delta alongside, so "
              f"readers that are up to date always fetch only the delta (the ratio columns); "
              f"'stored' = full size / everything written incl. snapshots (late joiners, GC)", "",
              "Per version, side by side: changed fraction / ratio"]
    head = f"{'v':>3}" + "".join(f"{r['opt'] + '@' + format(r['lr'], 'g'):>22}" for r in results)
    lines.append(head)
    for i in range(args.versions):
        cells = "".join(f"{r['rows'][i]['changed']:>12.3%} /{r['rows'][i]['ratio']:>6.1f}x"
                        for r in results)
        lines.append(f"{i + 1:>3}{cells}")
    lines.append("")
    lines.append("train loss of the first -> last version's batch (a different real batch every step): " + "; ".join(
        f"{r['opt']}@{r['lr']:g} {r['rows'][0]['loss']:.4f} -> {r['rows'][-1]['loss']:.4f}"
        for r in results))
    lines.append(f"devices: {jax.devices()}; cpus: {os.cpu_count()}; wall {meta['wall']:.0f} s")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
