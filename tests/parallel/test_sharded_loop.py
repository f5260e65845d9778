"""The whole training loop on 8 fake CPU devices equals the one-device run, step by step.

`sharded_loop_cases.py` (a subprocess: the XLA flag must precede JAX) trains the same tiny config
on real local code through `train.loop.train` with the mesh from `cfg.mesh`: parameters,
optimizer state and batches placed by the rules table, the jitted sharded step, evaluation and
Orbax checkpoints. Training loss, gradient norm and validation loss of every logged step must
match the single-device run, and the state must really be split over the devices. One case stops
a cp_ep run at a checkpoint step and resumes it on an fsdp mesh (Orbax reshards on restore).
"""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
GROUPS = {"a": ["one", "fsdp8", "cp_f2c2e2", "resume_cp_to_fsdp8"],
          "b": ["one", "ep_f2e4", "cp_c2e2t2_explicit"]}
TOL = 1e-4     # float32 at highest matmul precision; sharded sums only reorder the additions


def run_cases(tmp_path, names):
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run([sys.executable, os.path.join(HERE, "sharded_loop_cases.py"),
                           str(tmp_path), *names], capture_output=True, text=True, env=env,
                          timeout=900)
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[len("RESULT "):])
            results[r["case"]] = r
    assert proc.returncode == 0 and len(results) == len(names), proc.stderr[-4000:]
    return results


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_sharded_training_loop_matches_one_device(tmp_path, group):
    res = run_cases(tmp_path, GROUPS[group])
    ref = res.pop("one")
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
