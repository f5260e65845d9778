"""Compiling for a real TPU slice from this CPU machine (composer_jax.parallel.aot).

With libtpu installed (the `tpu` extra: `pip install -e '.[tpu]'`; `.ci/run` installs it) one
`launch.py --dry_run --set mesh.compile_topology=v5e:2x2` compiles the tiny train step, the
engine's decode step and the TPU Pallas kernels with XLA:TPU and Mosaic (the RL, prefill and
speculative steps too in a slow test); elsewhere those
tests skip and say how to enable them. The error paths and the target-platform switch need no
libtpu.
"""
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from composer_jax.config import MeshConfig
from composer_jax.errors import ConfigError
from composer_jax.parallel import aot, target

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
needs_libtpu = pytest.mark.skipif(
    not aot.libtpu_installed(),
    reason=f"libtpu is not installed; to compile for TPUs from this machine: {aot.INSTALL}")


def _dry_run(work, programs):
    """One dry run of cpt_debug compiled for v5e:2x2: the train step and `programs`."""
    cmd = [sys.executable, "launch.py", "--experiment=cpt_debug", "--dry_run", f"--workdir={work}",
           "--set", "mesh.compile_topology=v5e:2x2",
           "--set", f"mesh.compile_programs={programs}"]
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3000)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((work / "dry_run.json").read_text()), proc.stdout


@pytest.fixture(scope="module")
def v5e_dry_run(tmp_path_factory):
    """The train step, the decode step and the kernels (the RL, prefill and speculative steps add
    a minute of XLA:TPU compiling: the slow test below)."""
    return _dry_run(tmp_path_factory.mktemp("tpu_aot"), "decode,kernels")


@needs_libtpu
def test_tpu_aot_train_step_compiles_for_v5e(v5e_dry_run):
    r, out = v5e_dry_run
    t = r["target"]
    assert (t["platform"], t["topology"], t["device_kind"]) == ("tpu", "v5e:2x2", "TPU v5 lite")
    assert (t["num_chips"], t["num_devices"], t["compiled_for_target"]) == (4, 4, True)
    assert t["hbm_bytes_per_chip"] == t["hbm_bytes_per_device"] == 16 * 2**30
    assert r["mesh"]["fsdp"] == 4 and r["fits_hbm"] is True and r["compile_error"] is None
    mem, pdb = r["memory_analysis"], r["per_device_bytes"]
    # the TPU compiler's arguments hold the fsdp-sharded state and the batch shard
    assert mem["argument_size_in_bytes"] >= pdb["params"] + pdb["optimizer"]
    assert 0 < pdb["total"] < 2**30 and pdb["activations"] == mem["temp_size_in_bytes"] > 0
    assert sum(r["collective_bytes_per_step"].values()) > 0     # fsdp gathers and reductions
    assert "compiled by XLA:TPU for v5e:2x2" in out and "fits" in out
    # the per-buffer report: XLA:TPU's largest temporaries, each with its op, shape and source
    temps = r["largest_temporaries"]
    assert len(temps) >= 5 and "largest temporaries" in out
    assert all(t["bytes"] > 0 and t["op"] and "[" in t["shape"] for t in temps)
    assert temps[0]["bytes"] == max(t["bytes"] for t in temps)
    assert temps[0]["bytes"] <= pdb["activations"]
    assert any(t["source"].startswith(("model/", "train/")) for t in temps)
    # no device holds a full-size [V, D] (or [D, V]) embedding / LM-head gradient or weight
    v, d = r["config"]["vocab_size"], r["config"]["hidden_size"]
    full = {f"f32[{v},{d}]", f"f32[{d},{v}]", f"bf16[{v},{d}]", f"bf16[{d},{v}]"}
    assert not [t for t in temps if t["shape"] in full], temps


KERNELS = ("block_scaled_matmul", "grouped_block_scaled_matmul", "quantize_mxfp8")


def _check_programs(progs, names):
    assert set(progs) == set(names) | {f"kernel:{k}" for k in KERNELS}
    for name, p in progs.items():
        assert "error" not in p, (name, p.get("error"))
        assert p["fits_hbm"] is True and p["per_device_total"] > 0
    for k in set(names) & {"prefill", "decode", "spec"}:
        assert progs[k]["detail"]["cache_bytes"] > 0
    for k in KERNELS:
        assert progs[f"kernel:{k}"]["mosaic_kernels"] >= 1      # Mosaic compiled, not interpreted


@needs_libtpu
def test_tpu_aot_decode_step_and_kernels_compile_for_v5e(v5e_dry_run):
    _check_programs(v5e_dry_run[0]["programs"], ["decode"])


@needs_libtpu
@pytest.mark.slow
def test_tpu_aot_rl_engine_steps_and_kernels_compile_for_v5e(tmp_path):
    progs = _dry_run(tmp_path, "all")[0]["programs"]
    _check_programs(progs, ["rl", "prefill", "decode", "spec"])
    assert progs["spec"]["detail"]["spec_depth"] == 1
    # the spec step holds the MTP cache and a verify window: more than a plain decode step
    assert progs["spec"]["per_device_total"] > progs["decode"]["per_device_total"]
    assert sum(progs["rl"]["collective_bytes"].values()) > 0


def test_tpu_aot_bad_topology_names_list_the_valid_ones():
    for bad in ("v5e", "v9:2x2", "v5e-8"):
        with pytest.raises(ConfigError, match=r"valid topology names .*v5p:4x4x4.*tpu7x:8x8x4"):
            aot.check_name(bad)
    assert aot.check_name("tpu7x:8x8x4") == ("tpu7x", (8, 8, 4))


def test_tpu_aot_without_libtpu_names_the_install(monkeypatch):
    monkeypatch.setattr(aot, "libtpu_installed", lambda: False)
    with pytest.raises(ConfigError, match=r"libtpu.*pip install -e '\.\[tpu\]'"):
        aot.topology_devices("v5e:2x2")


def test_tpu_aot_compile_programs_are_validated():
    assert MeshConfig().programs() == ()
    assert MeshConfig(compile_topology="v5e:2x2", compile_programs="all").programs() == (
        "rl", "prefill", "decode", "spec", "kernels")
    with pytest.raises(ConfigError, match="unknown program"):
        MeshConfig(compile_topology="v5e:2x2", compile_programs="rl,foo")
    with pytest.raises(ConfigError, match="needs mesh.compile_topology"):
        MeshConfig(compile_programs="rl")


def test_tpu_aot_oom_report_reads_the_tpu_compiler_message():
    err = RuntimeError("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in "
                       "memory space hbm. Used 40.50G of 31.25G hbm. Exceeded hbm capacity by 9.25G.")
    r = aot.oom_report(err)
    assert (r["used"], r["limit"]) == (int(40.5 * 2**30), int(31.25 * 2**30))
    assert aot.oom_report(ValueError("shape mismatch")) is None
    # the form of libtpu 0.12 for a train step whose temporaries alone exceed HBM (v6e:16x16 kimi)
    r = aot.oom_report(RuntimeError(
        "RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory on HBM, the total memory "
        "required for HLO temporaries (50.66G) exceeds available HBM (31.24G). HLO module: jit_t"))
    assert (r["used"], r["temps"], r["limit"]) == (None, int(50.66 * 2**30), int(31.24 * 2**30))


def test_tpu_aot_target_platform_switches_the_cpu_paths():
    """Traced inside compiling_for('tpu') the MoE grouped matmul is ragged_dot (the TPU path), on
    the CPU backend it is the blocked einsum."""
    from composer_jax.quant.grouped import grouped_matmul
    x, w = jnp.zeros((16, 8)), jnp.zeros((2, 8, 4))
    gs = jnp.array([10, 6], jnp.int32)
    assert target.platform() == "cpu"
    assert "ragged_dot_general" not in str(jax.make_jaxpr(grouped_matmul)(x, w, gs))
    with target.compiling_for("tpu"):
        assert target.platform() == "tpu"
        assert "ragged_dot_general" in str(jax.make_jaxpr(grouped_matmul)(x, w, gs))
    assert target.platform() == "cpu"


def test_dry_run_fits_microbatches_to_a_larger_slice():
    """cpt_32k's 32 microbatches of 64 rows do not split over the 128 batch shards of a 512-device
    slice (TPU7x 8x8x4: fsdp 2 x expert 64); the planner takes 16 (128 rows, the same rows per
    device as 32 on 256 devices) and says so; a mesh that already splits is left alone."""
    from composer_jax import registry
    from composer_jax.dry_run import fit_microbatches
    cfg = registry.get("cpt_32k").make_config()
    assert cfg.train.microbatches == 32
    fitted, note = fit_microbatches(cfg, 512)
    assert fitted.train.microbatches == 16 and "32 -> 16" in note and "128 batch shards" in note
    same, none = fit_microbatches(cfg, 256)
    assert same is cfg and none is None
