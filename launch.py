"""composer_jax entry point.

  python launch.py --experiment=list
  python launch.py --experiment=NAME [--workdir=DIR] [--config=FILE] [--set key.path=value ...]
                   [--dry_run] [--show_config] [-v 1]

Experiments register by name from the modules under `experiments/`. The config is the experiment's
default, or a saved one (`--config=WORKDIR/config.json` reruns a run), with `--set` overrides on
top: typed and validated when parsed (composer_jax/overrides.py; the same as
`composer_jax.api.make_config` in Python). `--show_config` prints every key with its type, value
and default and exits. The resolved config is written to WORKDIR/config.json before the experiment
runs. WORKDIR may be a local path or any URL that etils.epath/Orbax accept (gs://bucket/run): it is
used as given for checkpoints, metrics and plots. `--dry_run` builds the model abstractly, counts
parameters and FLOPs/token and writes WORKDIR/dry_run.json without allocating parameters.

On a multi-host TPU/GPU slice (TPU VM pods, GKE, SLURM, Open MPI) no flag is needed: the cluster is
detected and jax.distributed is initialised; --coordinator etc. override the detection. Logging
follows absl's --verbosity / -v for every logger, JAX's and Orbax's included (default: warnings
only; -v 0 adds INFO, -v 1 DEBUG). SIGTERM / SIGINT during a training or RL loop finish the
current step, save a checkpoint and exit 0 (during their set-up: as soon as the loop starts);
in other experiments SIGTERM ends the process and Ctrl-C stops it with one line.
"""
from __future__ import annotations

import sys

from absl import app, flags, logging

flags.DEFINE_string("experiment", None, "experiment name, or 'list' to list them")
flags.DEFINE_string("workdir", None, "run directory, local or a URL such as gs://bucket/run "
                    "(default: runs/EXPERIMENT)")
flags.DEFINE_string("config", None, "start from this saved config.json (e.g. a previous run's "
                    "WORKDIR/config.json) instead of the experiment's default; --set applies on top")
flags.DEFINE_multi_string("set", [], "override: key.path=value (repeatable; the config keys are "
                          "listed after the flags)")
flags.DEFINE_bool("dry_run", False, "build and count/compile abstractly; run nothing")
flags.DEFINE_bool("show_config", False, "print every config key with its type, value and default, "
                  "then exit")
flags.DEFINE_string("coordinator", None, "multi-host: coordinator address host:port "
                    "(default: $COMPOSER_JAX_COORDINATOR, or TPU/SLURM/MPI auto-detection)")
flags.DEFINE_integer("num_processes", None, "multi-host: number of processes")
flags.DEFINE_integer("process_id", None, "multi-host: this process's index")
flags.DEFINE_string("local_device_ids", None, "multi-host: comma-separated local device ids")
FLAGS = flags.FLAGS


def _help() -> int | None:
    """`--help` (-h, -?, --helpfull): the usage above, the flags, then every config key with its
    type and default; exit status 0. None when help was not asked for."""
    argv = sys.argv[1:]
    if not any(a in ("--help", "-h", "--helpfull", "-?") for a in argv):
        return None
    from composer_jax.api import describe_config
    print((__doc__ or "").rstrip() + "\n")
    print("Flags:")
    FLAGS(sys.argv[:1], known_only=True)          # parsed with defaults, so help can show them
    print(FLAGS.module_help(sys.modules[__name__]) if "--helpfull" not in argv
          else FLAGS.get_help())
    print("  -v, --verbosity: logging verbosity (-1 warnings, the default; 0 info; 1 debug)")
    print("\nConfig keys (--set KEY=VALUE; a section may also be set to a preset, e.g. "
          "--set model=small):")
    print(describe_config(values=False))
    return 0


def _apply_verbosity() -> None:
    """absl's --verbosity for every Python logger (JAX, Orbax, Ray, ... log through `logging`);
    warnings only unless -v / --verbosity was given."""
    import logging as pylogging

    from absl.logging import converter
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    level = converter.absl_to_standard(logging.get_verbosity())
    pylogging.getLogger().setLevel(level)
    for name in list(pylogging.root.manager.loggerDict) + ["jax", "orbax", "absl", "ray"]:
        pylogging.getLogger(name).setLevel(level)


def _check_devices(cfg) -> None:
    """The mesh must fit the devices JAX sees (checked before anything is built)."""
    import jax
    from composer_jax.errors import ConfigError
    have = jax.device_count()
    want = cfg.mesh.num_devices or have
    if want > have:
        raise ConfigError(f"mesh.num_devices={want} but JAX sees {have} {jax.devices()[0].platform} "
                          f"device(s); set mesh.num_devices=0 to use all of them")
    cfg.mesh.resolved(want)


def main(argv):
    if len(argv) > 1:
        print(f"error: unexpected arguments {argv[1:]} (overrides go in --set key=value)",
              file=sys.stderr)
        return 2
    from composer_jax import registry
    from composer_jax.api import describe_config, enable_compilation_cache, load_config, save_config
    from composer_jax.config import SECTION_PRESETS
    from composer_jax.errors import ComposerError
    from composer_jax.overrides import apply_overrides
    from composer_jax.runlog import run_path
    from composer_jax import stopping

    _apply_verbosity()
    try:
        if FLAGS.experiment in (None, "", "list"):
            stopping.restore_default_signals()
            if FLAGS.config or FLAGS.show_config:
                raise ComposerError("--config / --show_config need --experiment=NAME (the "
                                    "experiment decides what runs; --experiment=list lists them)")
            exps = registry.load_all()
            width = max(len(n) for n in exps)
            print("experiments (python launch.py --experiment=NAME):")
            for name in sorted(exps):
                print(f"  {name:<{width}}  {exps[name].description}")
            return 0
        exp = registry.get(FLAGS.experiment)
        if not exp.stoppable or FLAGS.show_config or FLAGS.dry_run:
            stopping.restore_default_signals()
        base = load_config(FLAGS.config) if FLAGS.config else exp.make_config()
        cfg = apply_overrides(base, FLAGS.set, SECTION_PRESETS)
        if exp.check is not None:
            exp.check(cfg)
        if FLAGS.show_config:
            print(f"config of {exp.name}" + (f" from {FLAGS.config}" if FLAGS.config else "")
                  + " ('*': differs from the default):")
            print(describe_config(cfg))
            return 0
        if not FLAGS.dry_run:
            from composer_jax.parallel.multihost import initialize
            initialize(FLAGS.coordinator, FLAGS.num_processes, FLAGS.process_id,
                       FLAGS.local_device_ids)
            _check_devices(cfg)
            cache = enable_compilation_cache(cfg)
            logging.info("persistent compilation cache: %s", cache)
        workdir = run_path(FLAGS.workdir or f"runs/{exp.name}")
        workdir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, workdir / "config.json")
        if FLAGS.dry_run:
            from composer_jax.dry_run import dry_run
            dry_run(cfg, workdir)
        elif exp.stoppable:
            with stopping.stop_signals():     # a signal during set-up: the loop stops at once
                exp.run(cfg, workdir)
        else:
            exp.run(cfg, workdir)
        return 0
    except ComposerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nSIGINT: stopped outside a training loop (nothing to save); rerun the same command "
              "to start again", file=sys.stderr)
        return 130


if __name__ == "__main__":
    from composer_jax.stopping import record_early_signals
    record_early_signals()               # until the experiment is known (launch.main)
    code = _help()
    if code is not None:
        sys.exit(code)
    app.run(main)
