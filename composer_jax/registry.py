"""Experiment registry: experiments register by name from modules under `experiments/`.

An experiment is a name, a one-line description, a function that builds its default `Config`, and a
function `run(config, workdir)` that does the work. `launch.py` resolves overrides on top of the
default config, validates it, writes `config.json` and calls `run`.
"""
from __future__ import annotations

import dataclasses
import importlib
import pathlib
import pkgutil
from typing import Callable

from composer_jax.errors import ExperimentError


@dataclasses.dataclass(frozen=True)
class Experiment:
    name: str
    description: str
    make_config: Callable[[], object]
    run: Callable[[object, pathlib.Path], None]
    check: Callable[[object], None] | None = None   # raises ConfigError on a config it cannot run
    stoppable: bool = False    # stops cleanly on SIGTERM / SIGINT (composer_jax.stopping)
    workdir_name: Callable[[object], str] | None = None   # cfg -> the default run directory name
    # cfg -> (base, preset keys) or None: the defaults a run of the parsed cfg starts from, the
    # overrides then applied again on them (`config.flags.rebased_config`; an RL task family's
    # own settings)
    rebase: Callable[[object], tuple[object, tuple[str, ...]] | None] | None = None
    # (cfg, workdir) -> the config the run records in WORKDIR/config.json, with what the run
    # resolves made explicit (sft: its sample source and prompt); a rerun is compared with it
    record: Callable[[object, pathlib.Path], object] | None = None

    def default_workdir(self, cfg) -> str:
        """runs/NAME, or runs/<what workdir_name(cfg) says> (eval: named after the policy)."""
        return f"runs/{self.workdir_name(cfg) if self.workdir_name else self.name}"


_REGISTRY: dict[str, Experiment] = {}


def register(name: str, description: str, make_config: Callable[[], object],
             run: Callable[[object, pathlib.Path], None],
             check: Callable[[object], None] | None = None,
             stoppable: bool = False,
             workdir_name: Callable[[object], str] | None = None,
             rebase: Callable[[object], tuple[object, tuple[str, ...]] | None] | None = None,
             record: Callable[[object, pathlib.Path], object] | None = None) -> Experiment:
    """Registers an experiment; a second registration under the same name is an error. `check`
    (optional) validates a resolved config for this experiment when it is parsed; `stoppable`:
    its run stops cleanly on SIGTERM / SIGINT (a training or RL loop); `workdir_name(cfg)`: the
    default run directory's name when it depends on the config (default: the experiment's name);
    `rebase(cfg)`: the base config the overrides are applied on again once parsed, or None (e.g.
    `--set rl.task=coding` starts from the coding family's settings); `record(cfg, workdir)`: the config
    the run writes to config.json when it resolves settings itself, so a rerun of the same command
    is compared with what the first run recorded."""
    if name in _REGISTRY:
        raise ValueError(f"experiment {name!r} is registered twice")
    exp = Experiment(name, description, make_config, run, check, stoppable, workdir_name, rebase,
                     record)
    _REGISTRY[name] = exp
    return exp


def load_all() -> dict[str, Experiment]:
    """Imports every module of the `experiments` package so that each registers its experiments."""
    # on demand: the experiment modules import this registry to register themselves
    import experiments  # noqa: F401  (top-level package beside launch.py)

    for info in pkgutil.iter_modules(experiments.__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"experiments.{info.name}")
    return dict(_REGISTRY)


def get(name: str) -> Experiment:
    """Returns the named experiment or raises ExperimentError listing the valid names."""
    experiments = load_all()
    if name not in experiments:
        valid = ", ".join(sorted(experiments)) or "(none registered)"
        raise ExperimentError(f"unknown experiment {name!r}; valid experiments: {valid} "
                              f"(or 'list' to print them with descriptions)")
    return experiments[name]
