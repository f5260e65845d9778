"""The training loop (`train.loop.train`) on a mesh of 8 fake CPU devices vs one device.

Run as a script in a subprocess (the XLA flag must precede JAX):
    python sharded_loop_cases.py WORKDIR CASE [CASE ...]             one process, 8 devices
    python sharded_loop_cases.py --process I N PORT WORKDIR CASE ...  process I of N (multi-host:
        jax.distributed over localhost:PORT, 8/N CPU devices each, gloo collectives)
Each case trains the same tiny config on real local code through the whole loop (data pipeline,
placement by the rules table, jitted sharded step, evaluation, Orbax checkpoints) and prints
`RESULT {json}` with its logged metrics and how its state is laid out.
"""
import os
import sys

MULTI = sys.argv[1] == "--process"
NUM_PROCESSES = int(sys.argv[3]) if MULTI else 1
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + f" --xla_force_host_platform_device_count={8 // NUM_PROCESSES}")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import dataclasses
import sysconfig  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402

import jax  # noqa: E402

from composer_jax.config import Config, MeshConfig, TrainConfig, tiny  # noqa: E402
from composer_jax.data.config import DataConfig  # noqa: E402
from composer_jax.runlog import read_metrics  # noqa: E402
from composer_jax.train.loop import train  # noqa: E402

STEPS = 4
# name -> (mesh, microbatches); "one" is the single-device reference
CASES = {
    "one": (dict(num_devices=1), 1),
    "fsdp8": (dict(rules="fsdp"), 1),
    "ep_f2e4": (dict(fsdp=2, expert=4, rules="ep_fsdp"), 1),
    "cp_f2c2e2": (dict(fsdp=2, context=2, expert=2, rules="cp_ep"), 2),
    "cp_c2e2t2_explicit": (dict(fsdp=1, context=2, expert=2, tensor=2, rules="cp_ep",
                                axis_type="explicit"), 1),
}


def config(mesh: dict, micro: int, steps: int = STEPS) -> Config:
    model = dataclasses.replace(tiny(), vocab_size=512)
    data = DataConfig(source_roots=(sysconfig.get_paths()["stdlib"],), max_files=40,
                      validation_fraction=0.1, vocab_size=512, seq_len=64, global_batch_size=8,
                      tokenizer_train_bytes=400_000, progress=False)
    tc = TrainConfig(steps=steps, lr=1e-2, warmup_steps=1, log_every=1, eval_every=2,
                     eval_batches=2, checkpoint_every=2, keep_checkpoints=2, microbatches=micro)
    return Config(model=model, data=data, train=tc, mesh=MeshConfig(**mesh))


def layout(state) -> dict:
    """Per-device shard shape of a routed-expert weight and of the embedding."""
    p = state.params
    w = p["moe_layers"]["ffn"]["w_gate"]
    e = p["embed"]
    return {"expert_w": [list(w.shape), list(w.sharding.shard_shape(w.shape))],
            "embed": [list(e.shape), list(e.sharding.shard_shape(e.shape))],
            "devices": len(w.sharding.device_set)}


def run(workdir: pathlib.Path, name: str) -> dict:
    if name == "resume_cp_to_fsdp8":
        # Stop a cp_ep run at step 2, resume it on a different mesh (Orbax reshards on restore).
        first = config(*CASES["cp_f2c2e2"])
        train(first, workdir, interrupt_at=2)
        last = train(dataclasses.replace(first, mesh=MeshConfig(rules="fsdp"),
                                         train=dataclasses.replace(first.train, microbatches=1)),
                     workdir)
    else:
        last = train(config(*CASES[name]), workdir)
    rows = read_metrics(workdir)
    return {"case": name, "loss": {r["step"]: r["loss"] for r in rows if "loss" in r},
            "val": {r["step"]: r["val_loss"] for r in rows if "val_loss" in r},
            "grad_norm": {r["step"]: r["grad_norm"] for r in rows if "grad_norm" in r},
            "step": int(last.state.step), **layout(last.state)}


def main(root: str, names: list[str]) -> None:
    assert jax.device_count() == 8, jax.devices()
    for name in names:
        res = run(pathlib.Path(root) / name, name)
        res["processes"] = jax.process_count()
        if jax.process_index() == 0:
            print("RESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    if MULTI:
        from composer_jax.parallel.multihost import initialize
        assert initialize(f"localhost:{sys.argv[4]}", NUM_PROCESSES, int(sys.argv[2]))
        main(sys.argv[5], sys.argv[6:])
    else:
        main(sys.argv[1], sys.argv[2:])
