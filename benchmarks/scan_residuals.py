"""What our train step saves for the backward pass: the stacked residuals of the layer scan.

    python benchmarks/scan_residuals.py [--size small|mid] [--remat none] [--topology v6e:4x4]

Traces (no compile, seconds) the side-by-side harness's model (benchmarks/tpu_mid_buffers.py's
SIZES: ../shared/anchors/tpu_side_by_side.py's `ours_child` config) for the TPU slice and lists
the outputs of the forward scan over the MoE layers that the backward reads: global shapes
[L, ...] (a residual sharded over N devices takes 1/N of it per device; one that lives inside a
per-device shard_map is stacked per device: e.g. [L, 16*E, D, F] for 16 device copies of the
expert weights).
"""
from __future__ import annotations

import argparse
import math
import os

from tpu_mid_buffers import SIZES, sbs_config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size", choices=list(SIZES), default="mid")
    ap.add_argument("--remat", default="none")
    ap.add_argument("--topology", default="v6e:4x4")
    ap.add_argument("--vocab", type=int, default=129280)
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    import jax
    jax.config.update("jax_platforms", "cpu")
    from composer_jax.parallel.aot import compiling_for
    from composer_jax.parallel.mesh import make_mesh
    from composer_jax.train.plan import plan_devices, sharded_step
    s = SIZES[a.size]
    cfg = sbs_config(a.size, a.vocab, a.remat, a.topology)
    devices, _ = plan_devices(cfg)
    mesh = make_mesh(cfg.mesh, devices=devices, axis_type="auto")
    step, state, batch, _ = sharded_step(cfg, mesh)
    with compiling_for("tpu"), jax.set_mesh(mesh):
        jaxpr = step.jitted.trace(state, batch).jaxpr.jaxpr
    n_layers = s["layers"] - s["dense"]
    print(f"size {a.size}, remat {a.remat}, {a.topology} ({len(devices)} devices), vocab {a.vocab}")

    def walk(j):
        for e in j.eqns:
            if e.primitive.name == "scan" and e.params["length"] == n_layers:
                body = e.params["jaxpr"].jaxpr
                if len(body.eqns) < 2:        # the optimizer's / gradient's per-layer maps
                    continue
                outs = [v.aval for v in e.outvars
                        if getattr(v.aval, "shape", ()) and v.aval.shape[0] == n_layers]
                sized = sorted(((math.prod(x.shape) * x.dtype.itemsize, str(x)) for x in outs),
                               reverse=True)
                total = sum(b for b, _ in sized)
                print(f"scan over {n_layers} layers: {len(outs)} stacked outputs, "
                      f"{total / 2**30:.2f} GiB global = {total / 2**30 / len(devices):.2f} GiB "
                      f"per device if every one is split over the {len(devices)} devices")
                for b, name in sized[:a.top]:
                    print(f"  {b / 2**20:10.1f} MiB  {name}")
            for p in e.params.values():
                sub = getattr(p, "jaxpr", p)
                if hasattr(sub, "eqns") and e.primitive.name != "scan":
                    walk(sub)
    walk(jaxpr)


if __name__ == "__main__":
    main()
