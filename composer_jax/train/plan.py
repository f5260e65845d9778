"""The dry-run planner's train step: AOT-compile the sharded train step from abstract parameters.

`compile_plan(cfg, *planning_mesh(cfg))` must run in a process whose JAX sees at least
`cfg.mesh.num_devices` devices (fake CPU devices: XLA_FLAGS=--xla_force_host_platform_device_count=N,
set before JAX starts; `composer_jax.slice_plan.run_in_subprocess` starts such a process).
Nothing is allocated: the train state (parameters, router biases, optimizer state) and the batch
are `jax.ShapeDtypeStruct`s with shardings, and the step compiled is the training step itself
(`composer_jax.train.step.make_step_fns`: the experiment's optimizer, MTP loss, token-chunked
LM-head losses and `train.microbatches`-way gradient accumulation), lowered and compiled for the
CPU backend under the mesh's ParallelContext.

CPU-compiled memory *estimates* accelerator memory: same SPMD partitioning, scan/remat structure
and buffer liveness, but XLA:CPU's own fusion, layouts and float normalisation (it computes bf16
dots in f32, so some operands get f32 copies an accelerator would not make). One CPU lowering
would distort the estimate badly and is replaced in the planner's process:
`jax.lax.ragged_dot` (the MoE grouped matmuls) lowers on CPU to a dense matmul over every group
for every row (E_loc x the buffers); `use_native_grouped_gemm_memory` lowers it instead to a
stand-in with a native grouped GEMM's shapes, dtypes and FLOPs
(COMPOSER_PLAN_DENSE_RAGGED_DOT=1 keeps XLA:CPU's own lowering). The MoE ragged all-to-all is a
padded emulation on CPU (composer_jax.parallel.collectives), so its buffers and bytes are the
static worst case.

With `mesh.compile_topology` (a libtpu slice name) the process plans on that slice's compile-only
TPU devices instead (composer_jax.parallel.aot): the step is traced for the TPU
(`parallel.target.compiling_for`, so the real ragged all-to-all and ragged_dot are used, no
stand-ins) and compiled by XLA:TPU; a step over HBM is reported as `compile_error` (the other
programs of `mesh.compile_programs` are composer_jax.slice_plan's, above this layer).

Set COMPOSER_PLAN_DUMP_DIR=DIR to keep XLA's dumps of the step (optimized HLO, buffer
assignment, live ranges) in DIR. Reported: per-device bytes of parameters / optimizer state
(from the shardings), activations (the compiled temp size), the biggest buffers live at the
memory peak (XLA's live-range dump, grouped by the op that made them), and collective bytes per
step (composer_jax.parallel.hlo_stats).
"""
from __future__ import annotations

import glob
import math
import os
import time

import jax
from flax import nnx
from jax._src.interpreters import mlir
from jax._src.lax import lax as lax_internal

from composer_jax.model import abstract_model
from composer_jax.parallel import aot
from composer_jax.parallel.hlo_stats import collective_stats, peak_buffers
from composer_jax.parallel.memory_report import temporaries_from_dump
from composer_jax.parallel.mesh import make_mesh
from composer_jax.parallel.sharding import context_from_config, sharding_plan
from composer_jax.train.placement import abstract_batch
from composer_jax.train.step import TrainState, build_fns

# jit name of the compiled step (`api.jit_with_context` wraps it in `traced`): selects the dump
STEP_MODULE_RE = "jit_traced"


def _grouped_gemm_stand_in(lhs, rhs, group_sizes, *, ragged_dot_dimension_numbers, precision,
                           preferred_element_type, group_offset=None, out_sharding=None):
    """What a native grouped GEMM allocates, for planning only (the values are wrong).

    XLA:CPU lowers `ragged_dot` densely (every group for every row: G x the output and operand
    buffers), while TPU and cuDNN-backed GPU kernels read the operands and write the output once.
    This stand-in has the native op's shapes, dtypes and FLOPs: ragged non-contracting mode
    ([M,K] x [G,K,N] -> [M,N]) is one dot with one group's weight; ragged contracting mode (the
    weight gradient, [M,K] x [M,N] -> [G,K,N]) is one dot broadcast over the G groups.
    """
    del group_offset, out_sharding
    dn = ragged_dot_dimension_numbers
    mode, _ = lax_internal._ragged_dot_mode_and_dim(lhs.ndim, dn)
    (lc, rc), (lb, rb) = dn.dot_dimension_numbers

    def dot(a, b, dims):
        return jax.lax.dot_general(a, b, dims, precision=precision,
                                   preferred_element_type=preferred_element_type)

    if mode == lax_internal.RaggedDotMode.RAGGED_NONCONTRACTING:
        g = dn.rhs_group_dimensions[0]
        drop = lambda dims: tuple(d - (d > g) for d in dims)  # noqa: E731
        return dot(lhs, jax.lax.index_in_dim(rhs, 0, g, keepdims=False),
                   ((lc, drop(rc)), (lb, drop(rb))))
    out = dot(lhs, rhs, ((lc, rc), (lb, rb)))
    if mode == lax_internal.RaggedDotMode.RAGGED_CONTRACTING:
        return jax.lax.broadcast(out, group_sizes.shape[-1:])
    return out


def use_native_grouped_gemm_memory():
    """Registers `_grouped_gemm_stand_in` as the CPU lowering of ragged_dot. Only for a process
    that plans and never runs anything (the planner's subprocess): the values are wrong."""
    mlir.register_lowering(lax_internal.ragged_dot_general_p,
                           mlir.lower_fun(_grouped_gemm_stand_in, multiple_results=False),
                           platform="cpu")


def _bytes_of(tree) -> int:
    """Per-device bytes of a tree of ShapeDtypeStructs with shardings."""
    n = 0
    for leaf in jax.tree.leaves(tree):
        n += math.prod(leaf.sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
    return n


def abstract_state(fns):
    """The abstract TrainState of a StepFns (parameters in the master dtype, train.master_dtype)."""
    params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, fns.master_dtype),
                          nnx.to_pure_dict(fns.abstract_params))
    scalar = jax.ShapeDtypeStruct((), "int32")
    return TrainState(step=scalar, params=params, buffers=nnx.to_pure_dict(fns.abstract_buffers),
                      opt_state=jax.eval_shape(fns.tx.init, params), nonfinite_streak=scalar,
                      nonfinite_total=scalar)


def sharded_step(cfg, mesh):
    """(train_step jitted on `mesh`, abstract TrainState, abstract batch, params sharding plan):
    exactly the step and shardings the training loop uses (`train.step.build_fns`); the abstract
    inputs carry their shardings."""
    fns = build_fns(abstract_model(cfg.model, cfg.execution), cfg, mesh)
    pl = fns.placement
    return (fns.train_step, pl.with_shardings(abstract_state(fns), pl.state),
            pl.with_shardings(abstract_batch(cfg), pl.batch),
            sharding_plan(fns.abstract_params, pl.pc))


def plan_devices(cfg) -> tuple[list, dict | None]:
    """(devices to plan on, target description or None): the TPU slice of
    `mesh.compile_topology` (composer_jax.parallel.aot), else the first mesh.num_devices devices
    JAX sees (fake CPU devices in the planner's subprocess)."""
    name = cfg.mesh.compile_topology
    if name:
        devices = aot.topology_devices(name)
        return devices, aot.target_info(name, devices)
    n_dev = cfg.mesh.num_devices or jax.device_count()
    if jax.device_count() < n_dev:
        raise RuntimeError(f"planner needs {n_dev} devices, JAX sees {jax.device_count()}")
    return jax.devices()[:n_dev], None


def planning_mesh(cfg) -> tuple:
    """(mesh, target description or None) the planner compiles on (`plan_devices`); on fake CPU
    devices it first swaps in the native grouped-GEMM memory stand-in for ragged_dot."""
    devices, target = plan_devices(cfg)
    if target is None and os.environ.get("COMPOSER_PLAN_DENSE_RAGGED_DOT") != "1":
        use_native_grouped_gemm_memory()    # XLA:CPU's own ragged_dot lowering is dense
    # The step's sharding comes from the rules either way; an Auto mesh lets GSPMD place the rest
    # (mesh.axis_type=explicit changes how constraints are applied, not the layout).
    return make_mesh(cfg.mesh, devices=devices, axis_type="auto"), target


def compile_plan(cfg, mesh, target: dict | None, dump_dir: str | None = None) -> dict:
    """Compiles the train step of `cfg` on `mesh` (`planning_mesh`); returns memory/collective
    numbers and the sharding plan. dump_dir: where XLA was told to dump (XLA_FLAGS) the step's
    HLO, for the peak-memory breakdown."""
    n_dev = mesh.devices.size
    pc = context_from_config(mesh, cfg.mesh)
    step, state, batch, plan = sharded_step(cfg, mesh)
    # router selection biases (a few KB) count with the parameters
    p_bytes = _bytes_of(state.params) + _bytes_of(state.buffers)
    o_bytes, b_bytes = _bytes_of(state.opt_state), _bytes_of(batch)
    t0 = time.time()
    try:
        compiled, compile_s = aot.lower_and_compile(step.jitted, state, batch, mesh=mesh,
                                                    platform="tpu" if target else None)
    except Exception as e:
        oom = aot.oom_report(e) if target else None
        if oom is None:
            raise
        # XLA:TPU refuses a program that exceeds HBM: report what it needed
        return {"mesh": pc.sizes, "rules": pc.rules.name, "num_devices": n_dev,
                "microbatches": cfg.train.microbatches, "optimizer": cfg.train.optimizer.value,
                "master_dtype": cfg.train.master_dtype or cfg.execution.param_dtype.value,
                "per_device_bytes": {"params": p_bytes, "optimizer": o_bytes, "activations": None,
                                     "batch": b_bytes,
                                     "total": oom["used"] or (oom["temps"] and
                                                              oom["temps"] + p_bytes + o_bytes
                                                              + b_bytes)},
                "memory_analysis": None, "largest_buffers": [], "collective_bytes_per_step": {},
                "largest_collectives": [], "compile_seconds": round(time.time() - t0, 1),
                "sharding_plan": plan, "target": target, "compile_error": oom}
    mem = aot.compiled_memory(compiled)
    hlo = compiled.as_text()
    total = mem.pop("total")
    coll, top_coll = collective_stats(hlo)
    peak, temps = [], []
    if dump_dir:
        found = glob.glob(os.path.join(dump_dir, f"*{STEP_MODULE_RE}*live-range.txt"))
        if found:
            with open(found[0]) as f:
                peak = peak_buffers(f.read(), hlo)
        temps = temporaries_from_dump(dump_dir, STEP_MODULE_RE, hlo)
    out = {
        "mesh": pc.sizes, "rules": pc.rules.name, "num_devices": n_dev,
        "microbatches": cfg.train.microbatches,
        "optimizer": cfg.train.optimizer.value,
        "master_dtype": cfg.train.master_dtype or cfg.execution.param_dtype.value,
        "per_device_bytes": {"params": p_bytes, "optimizer": o_bytes,
                             "activations": mem["temp_size_in_bytes"], "batch": b_bytes,
                             "total": total},
        "memory_analysis": mem,
        "largest_buffers": peak,
        "largest_temporaries": temps,
        "collective_bytes_per_step": coll,
        "largest_collectives": top_coll,
        "compile_seconds": compile_s,
        "sharding_plan": plan,
        "target": target,
    }
    return out

