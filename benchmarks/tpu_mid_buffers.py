"""Per-buffer memory report of the side-by-side harness's mid model (our step), for any TPU slice.

    python benchmarks/tpu_mid_buffers.py [--topology v5p:2x2x4] [--remat none] [--vocab 129280]
        [--size mid] [--out DIR]

XLA:TPU refuses a program over HBM without a buffer assignment, so to see what fills a refused
v6e:4x4 compile this compiles the same per-device shapes (the model, dtypes and batch of
../shared/anchors/tpu_side_by_side.py's `ours_child`: FSDP over all 16 chips, 1 x 4096 tokens per
device) for a 16-chip slice with more HBM (v5p: 95 GiB) and prints the memory analysis and the
largest temporaries (composer_jax.parallel.memory_report) with HLO op, shape, live range and
source line. JSON to OUT/buffers_<size>_<topology>_<remat>_v<vocab>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile

SIZES = {
    "small": dict(emb=256, layers=4, dense=1, experts=8, topk=2, shared=1, heads=4, q_lora=32,
                  kv_lora=16, nope=128, rope=64, v=128, mlp=64, moe_mlp=64, per_dev_batch=4,
                  seq=256, chips=4),
    "mid": dict(emb=2048, layers=16, dense=1, experts=64, topk=8, shared=1, heads=16, q_lora=768,
                kv_lora=512, nope=128, rope=64, v=128, mlp=8192, moe_mlp=1024, per_dev_batch=1,
                seq=4096, chips=16),
}


def sbs_config(size: str, vocab: int, remat: str, topology: str):
    """The side-by-side harness's config of our step (its `ours_child`: model, dtypes, FSDP over
    the slice's chips, per-device batch x seq tokens) for `topology`."""
    from composer_jax.config import Config, ExecutionConfig, ModelConfig, TrainConfig
    from composer_jax.config.mesh import MeshConfig
    from composer_jax.data.config import DataConfig
    s = SIZES[size]
    model = ModelConfig(
        name=f"sbs_{size}_v{vocab}", vocab_size=vocab, hidden_size=s["emb"],
        num_layers=s["layers"], first_k_dense=s["dense"], dense_intermediate_size=s["mlp"],
        moe_intermediate_size=s["moe_mlp"], num_routed_experts=s["experts"],
        num_shared_experts=s["shared"], num_experts_per_tok=s["topk"], num_heads=s["heads"],
        q_lora_rank=s["q_lora"], kv_lora_rank=s["kv_lora"], qk_nope_head_dim=s["nope"],
        qk_rope_head_dim=s["rope"], v_head_dim=s["v"], mtp_depth=0,
        max_position_embeddings=max(4096, s["seq"]))
    return Config(model=model,
                  execution=ExecutionConfig(param_dtype="float32", compute_dtype="bfloat16",
                                            remat=remat),
                  mesh=MeshConfig(compile_topology=topology),
                  data=DataConfig(global_batch_size=s["per_dev_batch"] * s["chips"],
                                  seq_len=s["seq"]),
                  train=TrainConfig(steps=1000, warmup_steps=10))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size", choices=list(SIZES), default="mid")
    ap.add_argument("--topology", default="v5p:2x2x4")
    ap.add_argument("--remat", default="none")
    ap.add_argument("--vocab", type=int, default=129280)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--out", default="/tmp/tpu_mid_buffers")
    a = ap.parse_args()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    dump = tempfile.mkdtemp(prefix="mid_dump_", dir=out)
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={dump}"
                               " --xla_dump_hlo_as_text --xla_dump_hlo_module_re=jit_traced").strip()
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    import jax
    jax.config.update("jax_platforms", "cpu")
    from composer_jax.parallel.memory_report import format_rows, temporaries
    from composer_jax.train.plan import compile_plan, planning_mesh
    s = SIZES[a.size]
    cfg = sbs_config(a.size, a.vocab, a.remat, a.topology)
    mesh, target = planning_mesh(cfg)
    assert mesh.devices.size == s["chips"], (mesh.devices.size, s["chips"])
    plan = compile_plan(cfg, mesh, target, dump_dir=dump)
    plan.pop("sharding_plan", None)
    import glob
    ba = sorted(glob.glob(os.path.join(dump, "*jit_traced*buffer-assignment.txt")), key=os.path.getmtime)
    temps = plan.get("largest_temporaries", [])
    if ba:
        hlo_f = sorted(glob.glob(os.path.join(dump, "*jit_traced*after_optimizations.txt")),
                       key=os.path.getmtime)
        lr = sorted(glob.glob(os.path.join(dump, "*jit_traced*live-range.txt")), key=os.path.getmtime)
        if hlo_f:
            temps = temporaries(open(ba[-1]).read(), open(hlo_f[-1]).read(),
                                open(lr[-1]).read() if lr else "", a.top)
    plan["largest_temporaries"] = temps
    name = f"buffers_{a.size}_{a.topology.replace(':', '_')}_{a.remat}_v{a.vocab}.json"
    (out / name).write_text(json.dumps(plan, indent=1, default=str))
    mem = plan.get("memory_analysis") or {}
    print(f"per-device bytes: {json.dumps(plan['per_device_bytes'])}")
    print(f"memory_analysis: {json.dumps(mem)}")
    if plan.get("compile_error"):
        print(f"compile_error: {plan['compile_error']}")
    print("largest temporaries:")
    print("\n".join(format_rows(temps, a.top)))
    print(f"dump: {dump}\njson: {out / name}")


if __name__ == "__main__":
    sys.exit(main())
