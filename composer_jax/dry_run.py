"""`launch.py --dry_run`: what a configuration costs, without allocating it.

Counts parameters through `jax.eval_shape`, computes FLOPs per token from the config, resolves the
mesh against the device count, and writes WORKDIR/dry_run.json with the keys DESIGN.md fixes:
params_total, params_active, flops_per_token, mesh, per_device_bytes. Per-device memory comes from
compiling the sharded train step (composer_jax.parallel); until that is available here the memory
fields are null and the JSON says so in `notes`.
"""
from __future__ import annotations

import json
import pathlib

from composer_jax.config import Config, to_dict
from composer_jax.model.flops import flops_per_token
from composer_jax.model.params import count_params


def dry_run(cfg: Config, workdir: pathlib.Path) -> dict:
    import jax

    total, active = count_params(cfg.model)
    flops = flops_per_token(cfg.model, cfg.data.seq_len)
    n_dev = cfg.mesh.num_devices or jax.device_count()
    result = {
        "model": cfg.model.name,
        "params_total": total,
        "params_active": active,
        "flops_per_token": flops["total"],
        "flops_per_token_breakdown": flops,
        "seq_len": cfg.data.seq_len,
        "mesh": cfg.mesh.resolved(n_dev),
        "per_device_bytes": {"params": None, "optimizer": None, "activations": None,
                             "total": None},
        "notes": "per-device memory needs the sharded AOT compile of the parallelism layer; "
                 "not computed by this version",
        "config": to_dict(cfg.model),
    }
    path = workdir / "dry_run.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(path)
    print(f"model {cfg.model.name}: {total / 1e9:.3f}B parameters total, {active / 1e9:.3f}B active "
          f"per token (embedding and LM head included, MTP depth {cfg.model.mtp_depth})")
    print(f"training FLOPs/token at seq_len {cfg.data.seq_len}: {flops['total']:.4g} "
          f"(matmul {flops['matmul']:.4g}, attention {flops['attention']:.4g})")
    print(f"mesh: {result['mesh']}")
    print(f"wrote {path}")
    return result
