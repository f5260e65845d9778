"""composer_jax entry point.

  python launch.py --experiment=list
  python launch.py --experiment=NAME [--workdir=DIR] [--set key.path=value ...] [--dry_run]

Experiments register by name from the modules under `experiments/`. `--set` overrides are typed
and validated (see composer_jax/overrides.py); the resolved config is written to
WORKDIR/config.json before the experiment runs. `--dry_run` builds the model abstractly, counts
parameters and FLOPs/token and writes WORKDIR/dry_run.json without allocating parameters.
"""
from __future__ import annotations

import json
import os
import pathlib
import sys

from absl import app, flags, logging

flags.DEFINE_string("experiment", None, "experiment name, or 'list' to list them")
flags.DEFINE_string("workdir", None, "run directory (default: runs/EXPERIMENT)")
flags.DEFINE_multi_string("set", [], "override: key.path=value (repeatable)")
flags.DEFINE_bool("dry_run", False, "build and count/compile abstractly; run nothing")
flags.DEFINE_string("coordinator", None, "multi-host: coordinator address host:port "
                    "(default: $COMPOSER_JAX_COORDINATOR, or SLURM/TPU auto-detection)")
flags.DEFINE_integer("num_processes", None, "multi-host: number of processes")
flags.DEFINE_integer("process_id", None, "multi-host: this process's index")
flags.DEFINE_string("local_device_ids", None, "multi-host: comma-separated local device ids")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    from composer_jax import registry
    from composer_jax.config import SECTION_PRESETS, to_dict
    from composer_jax.errors import ComposerError
    from composer_jax.overrides import apply_overrides

    try:
        if FLAGS.experiment in (None, "", "list"):
            exps = registry.load_all()
            width = max(len(n) for n in exps)
            print("experiments (python launch.py --experiment=NAME):")
            for name in sorted(exps):
                print(f"  {name:<{width}}  {exps[name].description}")
            return 0
        exp = registry.get(FLAGS.experiment)
        if not FLAGS.dry_run:
            from composer_jax.parallel.multihost import initialize
            initialize(FLAGS.coordinator, FLAGS.num_processes, FLAGS.process_id,
                       FLAGS.local_device_ids)
        cfg = apply_overrides(exp.make_config(), FLAGS.set, SECTION_PRESETS)
        workdir = pathlib.Path(FLAGS.workdir or f"runs/{exp.name}").absolute()
        workdir.mkdir(parents=True, exist_ok=True)
        tmp = workdir / f"config.json.tmp{os.getpid()}"     # one per process (multi-host)
        tmp.write_text(json.dumps(to_dict(cfg), indent=2))
        tmp.replace(workdir / "config.json")
        if FLAGS.dry_run:
            from composer_jax.dry_run import dry_run
            dry_run(cfg, workdir)
        else:
            exp.run(cfg, workdir)
        return 0
    except ComposerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    app.run(main)
