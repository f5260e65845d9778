"""The dry-run planner: AOT-compile the sharded train step from abstract parameters.

`compile_plan(cfg)` must run in a process whose JAX sees at least `cfg.mesh.num_devices` devices
(fake CPU devices: XLA_FLAGS=--xla_force_host_platform_device_count=N, set before JAX starts;
`python -m composer_jax.parallel.plan CONFIG_JSON OUT_JSON` does that for itself). Nothing is
allocated: parameters, optimizer state and batch are `jax.ShapeDtypeStruct`s with shardings, the
step is lowered and compiled for the CPU backend, and the compiled memory analysis gives per-device
bytes. CPU-compiled memory *estimates* accelerator memory (same SPMD partitioning and buffer
liveness, but different fusion and layout decisions and no accelerator-specific kernels).

Collective bytes are read from the compiled HLO: the result bytes of every all-gather, all-reduce,
reduce-scatter, all-to-all and collective-permute, with ops inside `while` loops (the layer scan)
multiplied by the loop's known trip count. On CPU the MoE ragged all-to-all is the padded
emulation (composer_jax.parallel.collectives), so its all-to-all bytes are the worst case.
"""
from __future__ import annotations

import json
import math
import os
import re
import sys

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute",
               "ragged-all-to-all")
_DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1,
                "f64": 8, "s64": 8, "u64": 8, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2, "u16": 2}


def _shape_bytes(text: str) -> int:
    total = 0
    for dt, dims in re.findall(r"\b([a-z]+[0-9]*[a-z0-9]*)\[([0-9,]*)\]", text):
        if dt in _DTYPE_BYTES:
            total += _DTYPE_BYTES[dt] * math.prod(int(d) for d in dims.split(",") if d)
    return total


def collective_bytes(hlo: str) -> dict[str, int]:
    """Bytes each collective kind moves per step (per device), loops scaled by trip counts."""
    comps: dict[str, list[str]] = {}
    name = None
    for line in hlo.splitlines():
        m = re.match(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
        if m and not line.startswith(" "):
            name = m.group(1)
            comps[name] = []
            if line.startswith("ENTRY"):
                comps["__entry__"] = comps[name]
        elif name is not None:
            comps[name].append(line)

    memo: dict[str, dict[str, int]] = {}

    def total(comp: str, depth=0) -> dict[str, int]:
        if comp in memo or depth > 50:
            return memo.get(comp, {})
        acc: dict[str, int] = {}
        for line in comps.get(comp, []):
            m = re.match(r"\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(.*?)\s+([a-z\-]+)\(", line)
            if not m:
                continue
            shape, op = m.group(1), m.group(2)
            base = op.replace("-start", "")
            if base in COLLECTIVES and not op.endswith("-done"):
                acc[base] = acc.get(base, 0) + _shape_bytes(shape)
            if op == "while":
                body = re.search(r"body=%?([\w.\-]+)", line)
                trip = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
                n = int(trip.group(1)) if trip else 1
                if body:
                    for k, v in total(body.group(1), depth + 1).items():
                        acc[k] = acc.get(k, 0) + n * v
            for callee in re.findall(r"(?:to_apply|calls|branch_computations)=\{?%?([\w.\-]+)",
                                     line):
                if op in ("call", "conditional", "async-start"):
                    for k, v in total(callee, depth + 1).items():
                        acc[k] = acc.get(k, 0) + v
        memo[comp] = acc
        return acc

    return total("__entry__")


def _bytes_of(tree) -> int:
    """Per-device bytes of a tree of ShapeDtypeStructs with shardings."""
    import jax
    n = 0
    for leaf in jax.tree.leaves(tree):
        shape = leaf.sharding.shard_shape(leaf.shape)
        n += math.prod(shape) * leaf.dtype.itemsize
    return n


def compile_plan(cfg) -> dict:
    """Compiles the train step of `cfg` on a (virtual) mesh; returns memory/collective numbers and
    the sharding plan."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from composer_jax.model import abstract_model
    from composer_jax.parallel import api
    from composer_jax.parallel.mesh import make_mesh
    from composer_jax.parallel.sharding import context_from_config, sharding_plan

    n_dev = cfg.mesh.num_devices or jax.device_count()
    if jax.device_count() < n_dev:
        raise RuntimeError(f"planner needs {n_dev} devices, JAX sees {jax.device_count()}")
    mesh = make_mesh(cfg.mesh, devices=jax.devices()[:n_dev], axis_type=cfg.mesh.axis_type)
    pc = context_from_config(mesh, cfg.mesh)
    graphdef, params = nnx.split(abstract_model(cfg.model))
    b, t = cfg.data.global_batch_size, cfg.data.seq_len
    batch = {k: jax.ShapeDtypeStruct((b, t), jnp.int32) for k in
             ("tokens", "positions", "segment_ids", "targets")}
    batch["loss_mask"] = jax.ShapeDtypeStruct((b, t), jnp.float32)
    tx = api.adamw(cfg.train.lr)
    ps = api.state_shardings(params, pc)
    os_ = api.opt_state_shardings(tx, params, ps, pc)
    bs = api.batch_shardings(batch, pc)
    abs_opt = jax.eval_shape(tx.init, params)
    with_sh = lambda tree, sh: jax.tree.map(  # noqa: E731
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, sh)
    a_params, a_opt, a_batch = with_sh(params, ps), with_sh(abs_opt, os_), with_sh(batch, bs)
    step = api.jit_with_context(
        lambda p, o, bt: api.train_step(graphdef, tx, p, o, bt, pc), pc,
        in_shardings=(ps, os_, bs), out_shardings=(ps, os_, None, None), donate_argnums=(0, 1))
    import time
    t0 = time.time()
    with jax.set_mesh(mesh):
        lowered = step.jitted.lower(a_params, a_opt, a_batch)
    compiled = lowered.compile()
    compile_s = time.time() - t0
    mem = compiled.memory_analysis()
    p_bytes, o_bytes, b_bytes = _bytes_of(a_params), _bytes_of(a_opt), _bytes_of(a_batch)
    temp = int(mem.temp_size_in_bytes)
    total = int(mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
                + temp + mem.generated_code_size_in_bytes)
    coll = collective_bytes(compiled.as_text())
    return {
        "mesh": pc.sizes, "rules": pc.rules.name, "num_devices": n_dev,
        "per_device_bytes": {"params": p_bytes, "optimizer": o_bytes, "activations": temp,
                             "batch": b_bytes, "total": total},
        "memory_analysis": {k: int(getattr(mem, k)) for k in (
            "argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
            "temp_size_in_bytes", "generated_code_size_in_bytes")},
        "collective_bytes_per_step": coll,
        "compile_seconds": round(compile_s, 1),
        "sharding_plan": sharding_plan(params, pc),
    }


def main(argv):
    """python -m composer_jax.parallel.plan CONFIG_JSON OUT_JSON (sets the fake device count)."""
    cfg_path, out_path = argv[1], argv[2]
    with open(cfg_path) as f:
        raw = json.load(f)
    from composer_jax.config import Config, from_dict
    cfg = from_dict(Config, raw)
    result = compile_plan(cfg)
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)


def run_in_subprocess(cfg, cfg_json_path: str, out_path: str, n_dev: int) -> dict:
    """Runs `main` in a fresh interpreter with n_dev fake CPU devices; returns its result."""
    import subprocess
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                        f" --xla_force_host_platform_device_count={n_dev}").strip()
    env["JAX_PLATFORMS"] = "cpu"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "composer_jax.parallel.plan", cfg_json_path,
                           out_path], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        from composer_jax.errors import ComposerError
        reasons = {8: "SIGFPE: XLA:CPU overflows its int32 sizes on arrays this large",
                   9: "SIGKILL: likely out of host memory"}
        how = (f"was killed by signal {-proc.returncode} "
               f"({reasons.get(-proc.returncode, 'see stderr below')}; the whole global batch was "
               f"compiled for {n_dev} device(s))" if proc.returncode < 0
               else f"exited with status {proc.returncode}")
        raise ComposerError(
            f"the dry-run compile {how}. Plan on a virtual mesh sized for the job, e.g. "
            f"--set mesh.num_devices=256 --set mesh.expert=16 --set mesh.context=4 "
            f"--set mesh.tensor=4 --set mesh.fsdp=1 --set mesh.rules=cp_ep, or a smaller "
            f"data.global_batch_size.\n{proc.stderr[-6000:]}")
    with open(out_path) as f:
        return json.load(f)


if __name__ == "__main__":
    main(sys.argv)
