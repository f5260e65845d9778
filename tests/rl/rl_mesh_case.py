"""Fake-device case for tests/rl/test_rl_step.py: two rl_steps (beta > 0) on one device and on a
2-device fsdp mesh; prints one `RESULT {"one": metrics, "mesh": metrics}` line per step."""
import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"

import dataclasses  # noqa: E402
import json  # noqa: E402

import numpy as np  # noqa: E402

from composer_jax.config import Config, MeshConfig, RLConfig, TrainConfig, tiny  # noqa: E402
from composer_jax.model import init_model  # noqa: E402
from composer_jax.parallel.mesh import make_mesh  # noqa: E402
from composer_jax.rl.step import build_rl_step  # noqa: E402

B, T = 4, 16


def _batch():
    rng = np.random.default_rng(0)
    tok = rng.integers(0, 256, (B, T)).astype(np.int32)
    return dict(tokens=tok, positions=np.tile(np.arange(T, dtype=np.int32), (B, 1)),
                segment_ids=np.ones((B, T), np.int32), targets=np.roll(tok, -1, 1),
                loss_mask=np.ones((B, T), np.float32),
                behaviour_logp=np.full((B, T), -5.5, np.float32),
                rewards=np.array([1, 0, 1, 0], np.float32),
                resolved=np.array([1, 0, 1, 0], np.float32), sample_weight=np.ones(B, np.float32),
                group_ids=np.array([0, 0, 1, 1], np.int32),
                episode_ids=np.arange(B, dtype=np.int32))


def run(mesh_cfg):
    cfg = Config(model=dataclasses.replace(tiny(), mtp_depth=0), mesh=mesh_cfg or MeshConfig(),
                 rl=RLConfig(kl_coef=0.1),
                 train=TrainConfig(lr=1e-3, warmup_steps=0, steps=10))
    mesh = None if mesh_cfg is None else make_mesh(cfg.mesh)
    fns, state = build_rl_step(init_model(cfg.model, 0), cfg, mesh)
    out = []
    for _ in range(2):
        state, m = fns.rl_step(state, fns.place_batch(_batch()))
        out.append({k: float(v) for k, v in m.items()})
    return out


if __name__ == "__main__":
    for one, mesh in zip(run(None), run(MeshConfig(fsdp=2))):
        print("RESULT " + json.dumps({"one": one, "mesh": mesh}))
