"""`launch.py --dry_run`: what a configuration costs, without allocating it.

Counts parameters through `jax.eval_shape`, computes FLOPs per token from the config, then
AOT-compiles the sharded train step on the (virtual) mesh from abstract parameters
(composer_jax.slice_plan, run in a subprocess that sees `mesh.num_devices` fake CPU devices)
and writes WORKDIR/dry_run.json with the keys DESIGN.md fixes (params_total, params_active,
flops_per_token, mesh, per_device_bytes{params, optimizer, activations, total}) plus the bytes the
step's collectives move (`collective_bytes_per_step`, biggest sources in `largest_collectives`),
the biggest buffers live at the memory peak (`largest_buffers`), the largest temporaries with
their HLO op, shape, layout, live range, source line and jax name stack (`largest_temporaries`,
from XLA's buffer assignment: composer_jax.parallel.memory_report), and WORKDIR/sharding_plan.txt
(parameter path -> shape, dtype, PartitionSpec). CPU-compiled memory estimates accelerator memory;
it is not a measurement.

With `--set mesh.compile_topology=NAME` (a libtpu slice name such as v5p:8x8x4; needs the `tpu`
extra) the same step is compiled by the real XLA:TPU compiler for that slice's devices instead
(composer_jax.parallel.aot; the device count follows from the slice), dry_run.json's `target`
names the platform, topology, device kind and HBM per chip with `compiled_for_target: true`, and
`mesh.compile_programs` adds the RL step, the engine's prefill/decode/speculative steps and the
Pallas kernels under `programs`.
"""
from __future__ import annotations

import json
import os
import pathlib

from composer_jax.config import Config, to_dict
from composer_jax.errors import ConfigError
from composer_jax.model.flops import flops_per_token
from composer_jax.model.params import count_params
from composer_jax.parallel import aot
from composer_jax.parallel.memory_report import format_rows
from composer_jax.parallel.rules import get_rules
from composer_jax.slice_plan import run_in_subprocess

TPU_NOTE = ("per-device memory is XLA:TPU's compiled memory analysis of the train step for the "
            "target slice's devices (libtpu compile-only devices: the compiler a pod runs, "
            "Mosaic included); nothing was executed")
NOTE = ("per-device memory is XLA's compiled memory analysis of the train step for the CPU "
        "backend on a virtual mesh: an estimate of accelerator memory (same SPMD partitioning and "
        "liveness; fusion, layouts and kernels differ: XLA:CPU computes bf16 matmuls in f32, the "
        "MoE grouped matmuls are planned as native grouped GEMMs and the ragged all-to-all as its "
        "padded worst case), not a measurement")


def _gb(n):
    return "n/a" if n is None else f"{n / 2**30:.2f} GiB"


def fit_microbatches(cfg: Config, num_devices: int) -> tuple[Config, str | None]:
    """(cfg, note): when data.global_batch_size / train.microbatches rows do not split over the
    batch mesh axes of `num_devices` devices (a larger slice than the config was written for),
    the largest microbatch count below the configured one that does (fewer, larger microbatches:
    the same rows per device), with a note saying so; else cfg unchanged and None."""
    import dataclasses
    import math

    sizes = cfg.mesh.resolved(num_devices)
    shards = math.prod(sizes[a] for a in get_rules(cfg.mesh.rules).mesh_axes("batch")
                       if sizes.get(a, 1) > 1)
    b, micro = cfg.data.global_batch_size, cfg.train.microbatches
    if (b // micro) % shards == 0:
        return cfg, None
    fit = [m for m in range(micro, 0, -1) if b % m == 0 and (b // m) % shards == 0]
    if not fit:
        return cfg, None        # the step's own check explains what to change
    note = (f"train.microbatches {micro} -> {fit[0]}: {b} sequences in {micro} microbatches "
            f"do not split over the {shards} batch shards of this {num_devices}-device mesh; "
            f"{fit[0]} microbatches of {b // fit[0]} rows do (set train.microbatches to choose)")
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, microbatches=fit[0])), note


def dry_run(cfg: Config, workdir: pathlib.Path) -> dict:
    import jax

    if cfg.mesh.compile_topology and not os.environ.get("JAX_PLATFORMS"):
        # this process only counts and plans: keep JAX from probing for a local TPU once libtpu
        # is installed (the compile itself loads libtpu's compile-only devices)
        jax.config.update("jax_platforms", "cpu")

    total, active = count_params(cfg.model)
    flops = flops_per_token(cfg.model, cfg.data.seq_len)
    topo = cfg.mesh.compile_topology
    if topo:
        n_dev = len(aot.topology_devices(topo))     # clear errors: no libtpu, a bad name
        if cfg.mesh.num_devices not in (0, n_dev):
            raise ConfigError(f"mesh.num_devices={cfg.mesh.num_devices} but TPU topology {topo!r} "
                              f"has {n_dev} chips; leave mesh.num_devices=0 (it follows the slice)")
        hint = f"TPU topology {topo!r} has {n_dev} chips: choose mesh axes that multiply to it"
    else:
        n_dev = cfg.mesh.num_devices or jax.device_count()
        hint = ("A dry run plans on a virtual mesh of fake CPU devices: pass --set "
                "mesh.num_devices=N to the job's device count")
    try:
        cfg.mesh.resolved(n_dev)
    except ConfigError as e:
        raise ConfigError(f"{e}. {hint}") from None
    configured_micro = cfg.train.microbatches
    cfg, micro_note = fit_microbatches(cfg, n_dev)
    if micro_note:
        print(f"planner: {micro_note}")
    cfg_path = workdir / "dry_run_config.json"
    cfg_path.write_text(json.dumps(to_dict(cfg), indent=1))
    plan = run_in_subprocess(cfg, str(cfg_path), str(workdir / "dry_run_plan.json"),
                             1 if topo else n_dev)
    sharding = plan.pop("sharding_plan")
    target = plan["target"] or {"platform": "cpu", "topology": None,
                                "device_kind": "virtual CPU devices (an estimate)",
                                "num_chips": None, "num_devices": n_dev,
                                "hbm_bytes_per_chip": None, "hbm_bytes_per_device": None,
                                "compiled_for_target": False}
    note = TPU_NOTE if topo else NOTE
    result = {
        "model": cfg.model.name,
        "target": target,
        "params_total": total,
        "params_active": active,
        "flops_per_token": flops["total"],
        "flops_per_token_breakdown": flops,
        "seq_len": cfg.data.seq_len,
        "global_batch_size": cfg.data.global_batch_size,
        "microbatches": cfg.train.microbatches,
        "microbatches_configured": configured_micro,
        "optimizer": plan["optimizer"],
        "master_dtype": plan["master_dtype"],
        "mesh": plan["mesh"],
        "rules": plan["rules"],
        "per_device_bytes": plan["per_device_bytes"],
        "collective_bytes_per_step": plan["collective_bytes_per_step"],
        "largest_collectives": plan["largest_collectives"],
        "largest_buffers": plan["largest_buffers"],
        "largest_temporaries": plan.get("largest_temporaries", []),
        "memory_analysis": plan["memory_analysis"],
        "compile_seconds": plan["compile_seconds"],
        "fits_hbm": (False if plan.get("compile_error") else None
                     if target["hbm_bytes_per_device"] is None
                     or plan["per_device_bytes"]["total"] is None
                     else plan["per_device_bytes"]["total"] <= target["hbm_bytes_per_device"]),
        "compile_error": plan.get("compile_error"),
        "programs": plan.get("programs", {}),
        "notes": note,
        "config": to_dict(cfg.model),
        "execution": to_dict(cfg.execution),
        "mesh_config": to_dict(cfg.mesh),
    }
    path = workdir / "dry_run.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(path)
    (workdir / "sharding_plan.txt").write_text(
        "".join(f"{k}: {v}\n" for k, v in sorted(sharding.items())))
    (workdir / "dry_run_plan.json").unlink(missing_ok=True)
    pdb = result["per_device_bytes"]
    print(f"model {cfg.model.name}: {total / 1e9:.3f}B parameters total, {active / 1e9:.3f}B active "
          f"per token (embedding and LM head included, MTP depth {cfg.model.mtp_depth})")
    print(f"training FLOPs/token at seq_len {cfg.data.seq_len}: {flops['total']:.4g} "
          f"(matmul {flops['matmul']:.4g}, attention {flops['attention']:.4g})")
    print(f"mesh: {result['mesh']} rules={result['rules']}, {cfg.data.global_batch_size} sequences "
          f"in {cfg.train.microbatches} microbatch(es) (compiled in {plan['compile_seconds']}s)")
    print(f"per device: params {_gb(pdb['params'])}, optimizer {_gb(pdb['optimizer'])}, "
          f"activations {_gb(pdb['activations'])}, total {_gb(pdb['total'])}")
    if target["compiled_for_target"]:
        hbm = target["hbm_bytes_per_device"]
        print(f"compiled by XLA:TPU for {topo} ({target['num_chips']} chips, "
              f"{target['num_devices']} x {target['device_kind']}"
              + (f", {_gb(hbm)} HBM per device): {'fits' if result['fits_hbm'] else 'DOES NOT FIT'}"
                 if hbm else ")"))
        if result["compile_error"]:
            print(f"XLA:TPU refused the step: {result['compile_error']['message'][:600]}")
        for name, p in result["programs"].items():
            print(f"  {name}: " + (f"error {p['error'][:300]}" if "error" in p else
                                   f"{_gb(p['per_device_total'])} per device, compiled in "
                                   f"{p['compile_seconds']}s"))
    print("collectives per step per device: " + ", ".join(
        f"{k} {_gb(v)}" for k, v in sorted(result["collective_bytes_per_step"].items())))
    print("largest buffers live at the memory peak:")
    for b in result["largest_buffers"][:8]:
        print(f"  {_gb(b['bytes']):>11} {b['count']:>3} x {b['shape']:<32} {b['op']}")
    if result["largest_temporaries"]:
        print("largest temporaries (bytes on the device, count, shape, HLO op, live range in the "
              "schedule, source, jax name stack):")
        print("\n".join(format_rows(result["largest_temporaries"])))
    print(f"note: {note}")
    print(f"wrote {path} and {workdir / 'sharding_plan.txt'}")
    return result
