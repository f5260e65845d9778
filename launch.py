"""composer_jax entry point.

  python launch.py --experiment=list
  python launch.py --experiment=NAME [--workdir=DIR] [--config=RUN/config.json]
                   [--config.KEY=VALUE ...] [--sweep=SPEC] [--dry_run] [--show_config] [-v 1]

Every config key is an absl flag: --config.rl.lr=3e-4, --config.model=small (a section's preset),
--config.rl.task=lookup (a task family); --set KEY=VALUE is the same. The config is the
experiment's default (or the saved --config=RUN/config.json) with those flags on top, typed and
validated once. --show_config prints every key with its value and default; --helpfull lists every
key with its help. The resolved config is written to WORKDIR/config.json before the run; a rerun
into a workdir whose config.json differs (beyond --rewrite_config's list) is refused.
--sweep=SPEC runs one trial per point of a grid (docs/sweeps.md). WORKDIR may be a URL
(gs://bucket/run). Multi-host slices are detected (--coordinator etc. override). SIGTERM/SIGINT
during a training or RL loop save a checkpoint and exit 0.
"""
from __future__ import annotations

import pathlib
import sys

from absl import app, flags, logging

flags.DEFINE_string("experiment", None, "experiment name, or 'list' to list them")
flags.DEFINE_string("workdir", None, "run directory, local or a URL such as gs://bucket/run "
                    "(default: runs/EXPERIMENT, or what the experiment names, e.g. eval's policy)")
flags.DEFINE_multi_string("set", [], "KEY=VALUE: the same as --config.KEY=VALUE (repeatable)")
flags.DEFINE_multi_string("sweep", [], "a sweep axis KEY=V1,V2,... (repeat for a grid) or a Python "
                          "file defining SWEEP: one trial per point, each in WORKDIR/<point> "
                          "(docs/sweeps.md)")
flags.DEFINE_enum("sweep_backend", "local", ["local", "ray"], "run the trials here, one after "
                  "another, or as Ray Tune trials on a Ray cluster")
flags.DEFINE_list("sweep_metrics", [], "metrics compared in the sweep's table (default: val_loss, "
                  "loss, reward_mean, ... whichever the trials log)")
flags.DEFINE_string("ray_address", "", "--sweep_backend=ray: the cluster to use (\"\" starts a "
                    "local one for the sweep)")
flags.DEFINE_integer("sweep_parallel", 1, "--sweep_backend=ray: trials at once")
flags.DEFINE_bool("dry_run", False, "build and count/compile abstractly; run nothing")
flags.DEFINE_bool("show_config", False, "print every config key with its type, value and default, "
                  "then exit")
flags.DEFINE_bool("rewrite_config", False, "rerun WORKDIR with settings that differ from its "
                  "config.json (which then records them); without it such a rerun is refused")
flags.DEFINE_string("coordinator", None, "multi-host: coordinator address host:port "
                    "(default: $COMPOSER_JAX_COORDINATOR, or TPU/SLURM/MPI auto-detection)")
flags.DEFINE_integer("num_processes", None, "multi-host: number of processes")
flags.DEFINE_integer("process_id", None, "multi-host: this process's index")
flags.DEFINE_string("local_device_ids", None, "multi-host: comma-separated local device ids")
FLAGS = flags.FLAGS

_PARSED = {}      # what the flags parser resolved: base config, argv, the --config flag


def _parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing with the config flags of the chosen experiment defined first: its
    default config (or --config=FILE), section presets applied, then one flag per key."""
    from composer_jax import registry
    from composer_jax.api import load_config
    from composer_jax.config import SECTION_PRESETS, Config
    from composer_jax.config import flags as config_flags
    from composer_jax.errors import ComposerError
    try:
        argv = config_flags.alias_set_flags(list(argv))
        pre = flags.FlagValues()
        flags.DEFINE_string("experiment", None, "", flag_values=pre)
        flags.DEFINE_string("config", None, "", flag_values=pre)
        pre(argv, known_only=True)
        argv = config_flags.without_config_file(argv)
        overrides = config_flags.override_args(argv)
        name = pre.experiment
        exp = registry.get(name) if name not in (None, "", "list") else None
        if pre.config:
            base = load_config(pre.config)
        else:
            base = exp.make_config() if exp is not None else Config()
        base, argv = config_flags.apply_presets(base, argv, SECTION_PRESETS)
        every = any(a in ("--helpfull", "-helpfull") for a in argv)
        holder = config_flags.define_config_flag(base, FLAGS, argv, every_key=every)
        try:
            rest = FLAGS(argv)
        except flags.Error as e:
            raise ComposerError(config_flags.flag_error_text(e, base)) from None
    except flags.Error as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except ComposerError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    _PARSED.update(base=base, argv=argv, holder=holder, exp=exp, config_file=pre.config,
                   overrides=overrides)
    return rest


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


TIMES = "benchmarks/results/experiment_times.txt"


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def measured_times(text: str) -> dict[str, str]:
    """NAME -> how long it took, from the rows of TIMES (written by
    benchmarks/experiment_times.py): '4.9 min', '52 s with --config.rl.steps=10 (short; the
    default takes longer)', '40 s (--dry_run)', '5 s with FLAGS' (the flags it needs), or why
    there is no time."""
    out = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, setting, wall, _cpu, _load, rc, flags = [f.strip() for f in line.split(" | ")]
        took = _duration(float(wall))
        if rc != "0":
            out[name] = f"failed after {took} (exit {rc})" if rc != "124" else f"> {took}"
        elif setting == "default":
            out[name] = took
        elif setting == "dry_run":
            out[name] = f"{took} (--dry_run)"
        elif setting == "needs":
            out[name] = f"{took} with {flags}"
        else:
            out[name] = f"{took} with {flags} (short; the default takes longer)"
    return out


def _list() -> int:
    from composer_jax import registry
    exps = registry.load_all()
    path = pathlib.Path(__file__).resolve().parent / TIMES
    times = measured_times(path.read_text()) if path.exists() else {}
    width = max(len(n) for n in exps)
    print("experiments (python launch.py --experiment=NAME) [time on a 2-core CPU, first run of a "
          f"fresh clone: {TIMES}]:")
    for name in sorted(exps):
        print(f"  {name:<{width}}  {exps[name].description} [{times.get(name, 'not timed')}]")
    return 0


def main(argv):
    if len(argv) > 1:
        print(f"error: unexpected arguments {argv[1:]} (config keys go in --config.KEY=VALUE)",
              file=sys.stderr)
        return 2
    from composer_jax import stopping
    from composer_jax.api import describe_config, enable_compilation_cache, save_config
    from composer_jax.config import SECTION_PRESETS
    from composer_jax.config import flags as config_flags
    from composer_jax.errors import ComposerError
    from composer_jax.rerun import check_rerun
    from composer_jax.runlog import run_path

    _apply_verbosity()
    try:
        exp = _PARSED["exp"]
        if exp is None:
            stopping.restore_default_signals()
            if _PARSED["config_file"] or FLAGS.show_config or FLAGS.sweep:
                raise ComposerError("--config / --show_config / --sweep need --experiment=NAME "
                                    "(the experiment decides what runs; --experiment=list lists "
                                    "them)")
            return _list()
        cfg = config_flags.config_from_flag(_PARSED["base"], _PARSED["holder"], _PARSED["argv"])
        if exp.check is not None:
            exp.check(cfg)              # on what the user set, before a family's defaults
        if exp.rebase is not None and not _PARSED["config_file"]:
            cfg = config_flags.rebased_config(cfg, _PARSED["overrides"], SECTION_PRESETS,
                                              exp.rebase)
        if FLAGS.sweep:
            from composer_jax.sweep.run import run_sweep
            stopping.restore_default_signals()
            run_sweep(exp, FLAGS.sweep, cfg, FLAGS.workdir, FLAGS.sweep_backend,
                      FLAGS.sweep_metrics, FLAGS.ray_address, FLAGS.sweep_parallel,
                      FLAGS.rewrite_config)
            return 0
        if not exp.stoppable or FLAGS.show_config or FLAGS.dry_run:
            stopping.restore_default_signals()
        if FLAGS.show_config:
            print(f"config of {exp.name}" + (f" from {_PARSED['config_file']}"
                                             if _PARSED["config_file"] else "")
                  + " ('*': differs from the default):")
            print(describe_config(cfg))
            return 0
        workdir = run_path(FLAGS.workdir or exp.default_workdir(cfg))
        if exp.record is not None:
            cfg = exp.record(cfg, workdir)      # what the run resolves, as it will record it
        check_rerun(cfg, workdir, rewrite=FLAGS.rewrite_config)
        if not FLAGS.dry_run:
            from composer_jax.parallel.multihost import initialize
            initialize(FLAGS.coordinator, FLAGS.num_processes, FLAGS.process_id,
                       FLAGS.local_device_ids)
            _check_devices(cfg)
            cache = enable_compilation_cache(cfg)
            logging.info("persistent compilation cache: %s", cache)
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
    app.run(main, flags_parser=_parse_flags)
