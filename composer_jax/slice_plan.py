"""The dry-run planner's process: the train step's plan (composer_jax.train.plan) and, on a TPU
slice, every other program of `mesh.compile_programs` (composer_jax.aot_programs).

It sits above train, rl and inference. `run_in_subprocess` starts
`python -m composer_jax.slice_plan CONFIG_JSON OUT_JSON DUMP_DIR` with N fake CPU devices (XLA_FLAGS
must be set before JAX starts) and XLA's dumps of the step, for the peak-memory breakdown.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

from composer_jax import aot_programs
from composer_jax.config import Config, from_dict
from composer_jax.errors import ComposerError, ConfigError
from composer_jax.parallel import aot
from composer_jax.parallel.hlo_stats import collective_stats
from composer_jax.train.plan import STEP_MODULE_RE, compile_plan, planning_mesh


def plan_slice(cfg, dump_dir: str | None = None) -> dict:
    """The train step's plan (`train.plan.compile_plan`) and, with a TPU target, `programs`:
    the other programs of `mesh.compile_programs` compiled for it."""
    mesh, target = planning_mesh(cfg)
    out = compile_plan(cfg, mesh, target, dump_dir)
    if target:
        out["programs"] = compile_programs(cfg, mesh, target)
    return out


def compile_programs(cfg, mesh, target: dict) -> dict:
    """name -> {memory_analysis, per_device_total, fits_hbm, compile_seconds, collectives, detail}
    of each program of `mesh.compile_programs` (composer_jax.aot_programs), compiled for the TPU
    target; a program that does not compile records its error (the others still run)."""
    out = {}
    for kind in cfg.mesh.programs():
        try:
            progs = aot_programs.build(kind, cfg, mesh)
        except Exception as e:      # noqa: BLE001 - reported per program
            out[kind] = {"error": f"{type(e).__name__}: {str(e)[:2000]}"}
            continue
        for prog in progs:
            try:
                compiled, secs = aot.lower_and_compile(
                    prog.jitted, *prog.args, mesh=None if kind == "kernels" else mesh)
            except Exception as e:  # noqa: BLE001
                oom = aot.oom_report(e)
                out[prog.name] = {"error": f"{type(e).__name__}: {str(e)[:2000]}",
                                  "detail": prog.detail}
                if oom:
                    out[prog.name].update(per_device_total=oom["used"], fits_hbm=False)
                continue
            mem = aot.compiled_memory(compiled)
            total = mem.pop("total")
            hlo = compiled.as_text()
            coll, _ = collective_stats(hlo)
            out[prog.name] = {"per_device_total": total,
                              "mosaic_kernels": hlo.count('custom_call_target="tpu_custom_call"'),
                              "fits_hbm": aot.fits(total, target["hbm_bytes_per_device"]),
                              "memory_analysis": mem, "collective_bytes": coll,
                              "compile_seconds": secs, "detail": prog.detail}
            print(f"compiled {prog.name} for {target['topology']} in {secs}s: "
                  f"{total / 2**30:.2f} GiB per device", file=sys.stderr, flush=True)
    return out


def main(argv):
    """python -m composer_jax.slice_plan CONFIG_JSON OUT_JSON [DUMP_DIR] (run_in_subprocess
    sets the fake device count and the dump flags)."""
    cfg_path, out_path = argv[1], argv[2]
    dump_dir = argv[3] if len(argv) > 3 else None
    with open(cfg_path) as f:
        raw = json.load(f)
    cfg = from_dict(Config, raw)
    result = plan_slice(cfg, dump_dir)
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)


def run_in_subprocess(cfg, cfg_json_path: str, out_path: str, n_dev: int) -> dict:
    """Runs `main` in a fresh interpreter with n_dev fake CPU devices; returns its result."""
    keep = os.environ.get("COMPOSER_PLAN_DUMP_DIR")      # keep XLA's dumps there for inspection
    dump_dir = keep or tempfile.mkdtemp(prefix="composer_plan_")
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                        f" --xla_force_host_platform_device_count={n_dev}"
                        f" --xla_dump_to={dump_dir} --xla_dump_hlo_as_text"
                        f" --xla_dump_hlo_module_re={STEP_MODULE_RE}").strip()
    env["JAX_PLATFORMS"] = "cpu"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    try:
        proc = subprocess.run([sys.executable, "-m", "composer_jax.slice_plan", cfg_json_path,
                               out_path, dump_dir], env=env, capture_output=True, text=True)
    finally:
        if not keep:
            shutil.rmtree(dump_dir, ignore_errors=True)
    if proc.returncode != 0:
        last = proc.stderr.strip().splitlines()[-1:] or [""]
        if "ConfigError: " in last[0]:      # a config the mesh/slice cannot run: say just that
            raise ConfigError(last[0].split("ConfigError: ", 1)[1])
        reasons = {8: "SIGFPE: XLA:CPU overflows its int32 sizes on arrays this large",
                   9: "SIGKILL: likely out of host memory"}
        how = (f"was killed by signal {-proc.returncode} "
               f"({reasons.get(-proc.returncode, 'see stderr below')}; the whole global batch was "
               f"compiled for {n_dev} device(s))" if proc.returncode < 0
               else f"exited with status {proc.returncode}")
        raise ComposerError(
            f"the dry-run compile {how}. Plan on a virtual mesh sized for the job, e.g. "
            f"--set mesh.num_devices=256 --set mesh.expert=64 --set mesh.context=4 "
            f"--set mesh.fsdp=1 --set mesh.rules=cp_ep --set train.microbatches=N, or a smaller "
            f"data.global_batch_size.\n{proc.stderr[-6000:]}")
    with open(out_path) as f:
        return json.load(f)


if __name__ == "__main__":
    main(sys.argv)
