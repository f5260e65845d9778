"""composer_jax's train step vs MaxText 0.2.5's trainer on the same DeepSeek-V3-like model, run
alternately (A B A B) in one invocation at two vocabularies, on this (shared, noisy) CPU.

    python benchmarks/maxtext_side_by_side.py [--vocab 129280 32768] [--reps 2] [--steps 20]

Model (issue 19): emb 256, 4 layers (1 dense), 8 routed experts top-2 + 1 shared, 4 heads,
q_lora 32, kv_lora 16, qk_nope 128, qk_rope 64, v 128, mlp 64 (dense and expert), fp32 weights,
bf16 compute, batch 4 x 256, no MTP, AdamW (clip 1.0), synthetic data. MaxText runs through
../shared/anchors/maxtext_cpu.sh (ragged_dot MoE: megablox=false, sparse_matmul=true; its
other settings are its defaults, e.g. remat_policy=full, which the table prints); the config it
prints is checked against the one asked for. Both trainers run in fresh subprocesses, `--steps`
steps each; a run's figure is the median step time of its last 10 steps; each vocabulary's figure
is the median over `--reps` runs. Prints a table (with the machine load) and writes
benchmarks/results/maxtext_side_by_side.txt.
"""
from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
MT_SCRIPT = pathlib.Path(os.environ.get("MT_SCRIPT", "../shared/anchors/maxtext_cpu.sh"))
BATCH, SEQ = 4, 256

# The issue's model as MaxText overrides (model_name=deepseek3-tiny supplies MLA/rope/routing).
MT_OVERRIDES = dict(
    base_emb_dim=256, base_num_decoder_layers=4, first_num_dense_layers=1, num_experts=8,
    num_experts_per_tok=2, shared_experts=1, base_num_query_heads=4, base_num_kv_heads=4,
    q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
    base_mlp_dim=64, base_moe_mlp_dim=64, mtp_num_layers=0, dtype="bfloat16",
    weight_dtype="float32", per_device_batch_size=BATCH, max_target_length=SEQ,
    megablox="false", sparse_matmul="true", opt_type="adamw")
# What MaxText must print back (its names after scaling: emb_dim, mlp_dim, ...).
MT_EXPECT = dict(emb_dim="256", num_decoder_layers="4", first_num_dense_layers="1",
                 num_experts="8", num_experts_per_tok="2", shared_experts="1", mlp_dim="64",
                 moe_mlp_dim="64", num_query_heads="4", q_lora_rank="32", kv_lora_rank="16",
                 qk_nope_head_dim="128", qk_rope_head_dim="64", v_head_dim="128",
                 mtp_num_layers="0", dtype="bfloat16", weight_dtype="float32",
                 sparse_matmul="True", megablox="False", per_device_batch_size="4",
                 max_target_length="256")


def run_maxtext(vocab: int, steps: int, tag: str) -> dict:
    """One MaxText run: {"step_s", "tokens_per_s", "config", "remat"}; raises if its config
    differs from the issue's."""
    args = [f"{k}={v}" for k, v in {**MT_OVERRIDES, "vocab_size": vocab, "steps": steps}.items()]
    env = dict(os.environ, MT_TAG=tag)
    p = subprocess.run(["bash", str(MT_SCRIPT), *args], capture_output=True, text=True, env=env,
                       timeout=3600)
    out = p.stdout + p.stderr
    if p.returncode != 0:
        raise RuntimeError(f"MaxText run {tag} failed (rc {p.returncode}):\n{out[-3000:]}")
    cfg_line = next((ln for ln in out.splitlines() if ln.startswith("config: ")), "")
    cfg = dict(kv.split("=", 1) for kv in cfg_line[len("config: "):].split())
    want = {**MT_EXPECT, "vocab_size": str(vocab)}
    bad = {k: (cfg.get(k), v) for k, v in want.items() if cfg.get(k) != v}
    if bad:
        raise RuntimeError(f"MaxText ran another config than asked (key: (got, want)): {bad}\n"
                           f"{cfg_line}")
    m = re.search(r"step_time_median_last10 \(maxtext 'seconds'\): ([\d.]+) s", out)
    if not m:
        raise RuntimeError(f"no step time in MaxText's output:\n{out[-2000:]}")
    step = float(m.group(1))
    return {"step_s": step, "tokens_per_s": BATCH * SEQ / step, "config": cfg_line,
            "remat": cfg.get("remat_policy", "?")}


def run_ours(vocab: int, steps: int) -> dict:
    """One run of our trainer in a fresh process (`--_ours`): {"step_s", "tokens_per_s"}."""
    p = subprocess.run([sys.executable, __file__, "--_ours", str(vocab), "--steps", str(steps)],
                       capture_output=True, text=True, timeout=3600, cwd=ROOT)
    m = re.search(r"OURS step_s=([\d.]+) loss=([\d.naif]+)", p.stdout)
    if p.returncode != 0 or not m:
        raise RuntimeError(f"our run failed (rc {p.returncode}):\n{(p.stdout + p.stderr)[-3000:]}")
    step = float(m.group(1))
    return {"step_s": step, "tokens_per_s": BATCH * SEQ / step, "loss": m.group(2)}


def ours_child(vocab: int, steps: int) -> None:
    """Runs `steps` train steps of the issue config; prints the median of the last 10."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import jax
    from step_parts import StepRunner, issue_config
    cfg = issue_config(vocab)
    print(f"ours: {cfg.model}\n{cfg.execution}", flush=True)
    step = StepRunner(cfg, n_batches=steps)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        m = step()
        jax.block_until_ready(m)
        times.append(time.perf_counter() - t)
    med = statistics.median(times[-10:])
    print(f"OURS step_s={med:.4f} loss={float(m['loss']):.4f}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, nargs="+", default=[129280, 32768])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--_ours", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._ours:
        return ours_child(args._ours, args.steps)
    if args.steps < 12:
        ap.error("--steps must be >= 12 (median of the last 10 after compile/warm-up)")
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d_%H%M%S")
    runs = {v: {"maxtext": [], "ours": []} for v in args.vocab}
    loads, log = [], []
    for rep in range(args.reps):
        for v in args.vocab:
            order = ("maxtext", "ours") if rep % 2 == 0 else ("ours", "maxtext")
            for who in order:
                load0 = os.getloadavg()[0]
                r = (run_maxtext(v, args.steps, f"sbs_{stamp}_{v}_{rep}") if who == "maxtext"
                     else run_ours(v, args.steps))
                load1 = os.getloadavg()[0]
                loads += [load0, load1]
                runs[v][who].append(r)
                line = (f"rep {rep} vocab {v:>6} {who:8s} step {r['step_s']:.3f} s  "
                        f"{r['tokens_per_s']:7.1f} tok/s  load {load0:.1f}->{load1:.1f}")
                print(line, flush=True)
                log.append(line)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    mt_cfg = {v: runs[v]["maxtext"][0]["config"] for v in args.vocab}
    rows = ["| vocab | MaxText tokens/s | composer_jax tokens/s | ratio |", "|---|---|---|---|"]
    for v in args.vocab:
        mt = statistics.median(r["tokens_per_s"] for r in runs[v]["maxtext"])
        us = statistics.median(r["tokens_per_s"] for r in runs[v]["ours"])
        rows.append(f"| {v:,} | {mt:,.0f} | {us:,.0f} | {us / mt:.2f} |")
    text = "\n".join([
        f"MaxText 0.2.5 vs composer_jax, same model (issue 19), {BATCH} x {SEQ} tokens/step, "
        f"{args.steps} steps per run, median step of the last 10, median over {args.reps} "
        f"alternating runs per trainer ({now} UTC)",
        f"machine: {os.cpu_count()} CPUs, shared; 1-min load average during the runs: "
        f"min {min(loads):.1f}, median {statistics.median(loads):.1f}, max {max(loads):.1f}",
        "command: python benchmarks/maxtext_side_by_side.py " + " ".join(sys.argv[1:]),
        "", *rows, "", "runs (in order):", *log, "", "MaxText config as printed by maxtext_cpu.sh:",
        *(f"  vocab {v}: {c}" for v, c in mt_cfg.items()),
        "MaxText settings not overridden keep its defaults (remat_policy="
        f"{runs[args.vocab[0]]['maxtext'][0]['remat']}); ours: execution.remat=none, "
        "MoE via ragged_dot, LM head + CE fused and vocabulary-tiled (composer_jax.train.losses."
        "fused_head_ce)."])
    print("\n" + text)
    out = ROOT / "benchmarks" / "results" / "maxtext_side_by_side.txt"
    tmp = out.with_suffix(".tmp")
    tmp.write_text(text + "\n")
    tmp.replace(out)


if __name__ == "__main__":
    main()
