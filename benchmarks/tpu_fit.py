"""Does kimi_k2_5 fit real TPU slices? Compiles the cpt_32k / cpt_256k train steps with XLA:TPU.

    python benchmarks/tpu_fit.py [--rows NAME,...] [--table]

Each row runs `python launch.py --experiment=E --dry_run --set mesh.compile_topology=SLICE ...`
(the `tpu` extra: libtpu) and copies its dry_run.json to benchmarks/results/tpu_fit/NAME.json
(rows whose file exists are skipped, so the script resumes). CPU estimates for the same mesh run
the same command without compile_topology (fake CPU devices) into NAME.cpu.json. `--table` only
writes benchmarks/results/tpu_fit.md (the README table) from the files present; a row without a
file is listed as not run, and each row names the commit of the step it compiled (`before #44`:
an older file without one; delete a row's file to compile it again with the current step).

`--kernels` compiles each TPU Pallas kernel (block-scaled matmul, grouped matmul, MXFP8 quantize)
at kimi_k2_5's production shapes (`composer_jax.aot_programs.kernel_cases` of cpt_32k) for one chip
of each slice family with Mosaic, in this process, into tpu_fit/kimi_kernels_<chip>.json and the
table's kernel section.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "tpu_fit"
# name, experiment, slice, extra --set overrides (the mesh: fsdp=-1 fills the rest of the slice)
ROWS = [
    ("cpt_32k_tpu7x_8x8x4", "cpt_32k", "tpu7x:8x8x4", []),
    ("cpt_32k_v5p_8x8x4", "cpt_32k", "v5p:8x8x4", []),
    ("cpt_256k_tpu7x_8x8x4", "cpt_256k", "tpu7x:8x8x4", ["mesh.context=64"]),
    ("cpt_256k_v5p_8x8x4", "cpt_256k", "v5p:8x8x4", []),
    ("cpt_32k_v6e_16x16", "cpt_32k", "v6e:16x16", []),
    ("cpt_256k_v6e_16x16", "cpt_256k", "v6e:16x16", []),
    # the default meshes that XLA:TPU refused as over HBM, again with half (or a quarter) the
    # tokens per device per microbatch: more context shards, fewer expert shards, more microbatches
    ("cpt_256k_v5p_8x8x4_ctx64", "cpt_256k", "v5p:8x8x4", ["mesh.context=64", "mesh.expert=4",
                                                          "train.microbatches=64"]),
    ("cpt_32k_v5p_8x8x4_ctx8", "cpt_32k", "v5p:8x8x4", ["mesh.context=8", "mesh.expert=32",
                                                       "train.microbatches=64"]),
    ("cpt_32k_v6e_16x16_ctx16", "cpt_32k", "v6e:16x16",
     ["mesh.context=16", "mesh.expert=16", "train.microbatches=128"]),
]


def command(exp: str, topo: str | None, sets: list[str], workdir: str, n_dev: int = 0) -> list:
    cmd = [sys.executable, "launch.py", f"--experiment={exp}", "--dry_run", f"--workdir={workdir}"]
    for s in sets:
        cmd += ["--set", s]
    if topo:
        cmd += ["--set", f"mesh.compile_topology={topo}"]
    else:
        cmd += ["--set", f"mesh.num_devices={n_dev}"]
    return cmd


def run_row(name: str, exp: str, topo: str, sets: list[str], cpu: bool) -> None:
    dest = OUT / (f"{name}.cpu.json" if cpu else f"{name}.json")
    if dest.exists():
        print(f"{name}: {dest.name} exists, skipped", flush=True)
        return
    workdir = f"/tmp/tpu_fit/{name}{'_cpu' if cpu else ''}"
    n_dev = 0
    if cpu:
        tpu = json.loads((OUT / f"{name}.json").read_text())
        n_dev = tpu["target"]["num_devices"]
    cmd = command(exp, None if cpu else topo, sets, workdir, n_dev)
    print(f"{name}: {' '.join(cmd[1:])}", flush=True)
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
    print(f"{name}: exit {proc.returncode} after {time.time() - t0:.0f}s\n"
          + "\n".join(line for line in proc.stdout.splitlines()[:12]), flush=True)
    if proc.returncode != 0:
        print(proc.stderr[-3000:], flush=True)
        return
    OUT.mkdir(parents=True, exist_ok=True)
    result = json.loads((pathlib.Path(workdir) / "dry_run.json").read_text())
    # the launch command, its scratch workdir named WORKDIR (no machine path in the results)
    result["command"] = "python " + " ".join(cmd[1:]).replace(workdir, "WORKDIR")
    result["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                      capture_output=True, text=True).stdout.strip()
    tmp = dest.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(dest)
    shutil.rmtree(workdir, ignore_errors=True)


KERNEL_CHIPS = [("v5p", "v5p:2x2x1"), ("v6e", "v6e:2x2"), ("tpu7x", "tpu7x:2x2x1")]


def run_kernels() -> None:
    """Compiles kimi_k2_5's kernel cases for one chip of each family (Mosaic); writes
    tpu_fit/kimi_kernels_<chip>.json (skips chips whose file exists)."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.path.insert(0, str(ROOT))
    from composer_jax import registry
    from composer_jax.aot_programs import kernel_programs
    from composer_jax.parallel import aot
    cfg = registry.get("cpt_32k").make_config()
    for chip, topo in KERNEL_CHIPS:
        dest = OUT / f"kimi_kernels_{chip}.json"
        if dest.exists():
            print(f"{dest.name} exists, skipped", flush=True)
            continue
        devices = aot.topology_devices(topo)
        target = aot.target_info(topo, devices[:1])
        out = {"model": cfg.model.name, "experiment": "cpt_32k", "target": target, "kernels": {}}
        for prog in kernel_programs(cfg, devices[0]):
            compiled, secs = aot.lower_and_compile(prog.jitted, *prog.args, platform="tpu")
            mem = aot.compiled_memory(compiled)
            out["kernels"][prog.name] = {
                "shapes": prog.detail, "compile_seconds": secs, "per_device_total": mem["total"],
                "memory_analysis": mem,
                "mosaic_kernels": compiled.as_text().count('custom_call_target="tpu_custom_call"'),
                "fits_hbm": aot.fits(mem["total"], target["hbm_bytes_per_device"])}
            print(f"{chip} {prog.name} {prog.detail}: {mem['total'] / 2**20:.1f} MiB, "
                  f"{secs}s", flush=True)
        OUT.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_suffix(".tmp")
        tmp.write_text(json.dumps(out, indent=2))
        tmp.replace(dest)


def kernel_table() -> str:
    lines = []
    for chip, topo in KERNEL_CHIPS:
        f = OUT / f"kimi_kernels_{chip}.json"
        if not f.exists():
            continue
        r = json.loads(f.read_text())
        for name, k in r["kernels"].items():
            shapes = ", ".join(f"{a}={b}" for a, b in k["shapes"].items())
            lines.append(f"| {r['target']['device_kind']} (`{topo}`, one device) | `{name[7:]}` | "
                         f"{shapes} | {k['mosaic_kernels']} | {k['per_device_total'] / 2**20:.1f} MiB"
                         f" | {k['compile_seconds']:.1f} s |")
    if not lines:
        return ""
    return ("\nkimi_k2_5's TPU Pallas kernels at production shapes, compiled by Mosaic "
            "(`python benchmarks/tpu_fit.py --kernels`):\n\n"
            "| chip | kernel | shapes | Mosaic calls | memory | compile |\n|---|---|---|---|---|---|\n"
            + "\n".join(lines) + "\n")


def oom_report(err):
    sys.path.insert(0, str(ROOT))
    from composer_jax.parallel.aot import oom_report as report
    return report(err)


def _gib(n) -> str:
    return "n/a" if n is None else f"{n / 2**30:.1f}"


# the committed CPU plans of the default meshes (README "Parallelism"), used when a row has the mesh
CPU_PLANS = {"cpt_32k": "dry_run_32k.json", "cpt_256k": "dry_run_256k.json"}


def _cpu_estimate(name: str, exp: str, r: dict) -> str:
    """The CPU planner's total for the row's mesh: NAME.cpu.json, else the committed plan of the
    experiment's default mesh when the mesh and microbatches match, else 'not run'."""
    own = OUT / f"{name}.cpu.json"
    if own.exists():
        return f"{_gib(json.loads(own.read_text())['per_device_bytes']['total'])} GiB"
    ref = ROOT / "benchmarks" / "results" / CPU_PLANS.get(exp, "-")
    if ref.exists():
        c = json.loads(ref.read_text())
        if c["mesh"] == r["mesh"] and c["microbatches"] == r["microbatches"]:
            return f"{_gib(c['per_device_bytes']['total'])} GiB (`{ref.name}`)"
    return "not run"


def table() -> str:
    lines = ["| stage | slice (chips / devices) | mesh (`cp_ep`) | microbatches | XLA:TPU per device "
             "(args + temps) | HBM per device | fits | compile | CPU estimate (same mesh) | step |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    missing = []
    for name, exp, topo, sets in ROWS:
        f = OUT / f"{name}.json"
        if not f.exists():
            missing.append(f"{name} (`{exp}` on `{topo}`)")
            continue
        r = json.loads(f.read_text())
        t, pdb, mem = r["target"], r["per_device_bytes"], r["memory_analysis"]
        mesh = " x ".join(f"{k}{v}" for k, v in r["mesh"].items() if v > 1)
        if mem:
            used = (f"**{_gib(pdb['total'])} GiB** ({_gib(mem['argument_size_in_bytes'])} + "
                    f"{_gib(mem['temp_size_in_bytes'])})")
        else:       # XLA:TPU refused the step: what its message says it needed
            oom = oom_report(Exception(r["compile_error"]["message"])) or {}
            args = pdb["params"] + pdb["optimizer"] + pdb["batch"]
            total = pdb["total"] or (oom.get("temps") and args + oom["temps"])
            used = (f"**{_gib(total)} GiB** ({_gib(args)} + {_gib(oom.get('temps'))}; "
                    f"refused: over HBM)")
            r["fits_hbm"] = False
        cpu = _cpu_estimate(name, exp, r)
        fits = {True: "yes", False: "**no**", None: "?"}[r["fits_hbm"]]
        lines.append(f"| {exp} | `{topo}` ({t['num_chips']} / {t['num_devices']}) | {mesh} | "
                     f"{r['microbatches']} | {used} | {_gib(t['hbm_bytes_per_device'])} GiB | "
                     f"{fits} | {r['compile_seconds']:.0f} s | {cpu} | "
                     f"{'`' + r['commit'] + '`' if r.get('commit') else 'before #44'} |")
    if missing:
        lines.append("")
        lines.append("Not compiled (no results file): " + "; ".join(missing) + ".")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="", help="comma list of row names (default: all)")
    ap.add_argument("--cpu", action="store_true", help="also the CPU estimate of each row")
    ap.add_argument("--table", action="store_true", help="only write the table")
    ap.add_argument("--kernels", action="store_true",
                    help="only compile kimi_k2_5's Pallas kernels for one chip per family")
    a = ap.parse_args()
    if a.kernels:
        run_kernels()
    elif not a.table:
        want = set(filter(None, a.rows.split(",")))
        for name, exp, topo, sets in ROWS:
            if not want or name in want:
                run_row(name, exp, topo, sets, cpu=False)
                if a.cpu and (OUT / f"{name}.json").exists():
                    run_row(name, exp, topo, sets, cpu=True)
    md = table() + kernel_table()
    (ROOT / "benchmarks" / "results" / "tpu_fit.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
