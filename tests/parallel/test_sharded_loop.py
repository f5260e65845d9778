"""The whole training loop on 8 fake CPU devices equals the one-device run, step by step.

`sharded_loop_cases.py` (a subprocess: the XLA flag must precede JAX) trains the same tiny config
on real local code through `train.loop.train` with the mesh from `cfg.mesh`: parameters,
optimizer state and batches placed by the rules table, the jitted sharded step, evaluation and
Orbax checkpoints. Training loss, gradient norm and validation loss of every logged step must
match the single-device run, and the state must really be split over the devices. One case stops
a cp_ep run at a checkpoint step and resumes it on an fsdp mesh (Orbax reshards on restore).
The multi-host test runs the same loop as two processes of 4 CPU devices each (jax.distributed on
localhost, gloo collectives): each process loads only its half of every batch.
"""
import os
import socket
import subprocess
import sys

import pytest
from device_subprocess import parse_results, run_script, subprocess_env

HERE = os.path.dirname(os.path.abspath(__file__))
# cp_f2c2e2 runs whole in the two-process test and for two steps in resume_cp_to_fsdp8
# one reference run per subprocess; the tensor-parallel explicit-axes loop is slow (test_sharded.py
# runs explicit axes and tensor parallelism step by step in CI)
GROUPS = {"a": ["one", "fsdp8", "resume_cp_to_fsdp8", "ep_f2e4"],
          "slow": ["one", "cp_c2e2t2_explicit"]}
TOL = 1e-4     # float32 at highest matmul precision; sharded sums only reorder the additions
SCRIPT = os.path.join(HERE, "sharded_loop_cases.py")


def run_cases(tmp_path, names):
    return {r["case"]: r for r in run_script(SCRIPT, names, prefix=[tmp_path])}


def check_against(ref: dict, res: dict) -> None:
    assert ref["devices"] == 1 and ref["step"] == 4
    assert set(ref["loss"]) == {"1", "2", "3", "4"} and {"2", "4"} <= set(ref["val"])
    assert ref["loss"]["4"] < ref["loss"]["1"] - 0.2, ref["loss"]     # it does train
    for name, r in res.items():
        assert r["step"] == 4 and r["devices"] == 8, r
        for key in ("loss", "grad_norm", "val"):
            for step, want in ref[key].items():
                assert r[key][step] == pytest.approx(want, rel=TOL, abs=TOL), (name, key, step)
        # really sharded: a device holds a fraction of the expert weights and the embedding
        (full_w, shard_w), (full_e, shard_e) = r["expert_w"], r["embed"]
        assert shard_w[1] * shard_w[2] * shard_w[3] < full_w[1] * full_w[2] * full_w[3], r
        assert shard_e[0] * shard_e[1] < full_e[0] * full_e[1], r


@pytest.mark.parametrize("group", ["a", pytest.param("slow", marks=pytest.mark.slow)])
def test_sharded_training_loop_matches_one_device(tmp_path, group):
    res = run_cases(tmp_path, GROUPS[group])
    check_against(res.pop("one"), res)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_two_process_training_loop_matches_one_device(tmp_path):
    names = ["cp_f2c2e2"]          # fsdp8 alone runs in group a; cp_f2c2e2 splits data, expert
                                   # and context over the two processes
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, SCRIPT, "--process", str(i), "2", port,
                               str(tmp_path / "multi"), *names], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=subprocess_env())
             for i in range(2)]
    ref = run_cases(tmp_path / "single", ["one"])["one"]
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-4000:]
    res = {r["case"]: r for r in parse_results(outs[0][0])}
    assert set(res) == set(names) and all(r["processes"] == 2 for r in res.values()), res
    check_against(ref, res)
