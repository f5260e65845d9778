"""The `sweep` section: the pretraining-budget sweep of `cpt_rl_sweep` (experiments/cpt_rl_sweep.py)."""
from __future__ import annotations

import dataclasses
import re

from composer_jax.config.checks import _check

CELL_RE = re.compile(r"^b(\d+)-s(\d+)$")


def cell_name(budget: int, seed: int) -> str:
    """The run directory name of one (budget, seed) cell: `b{budget}-s{seed}`."""
    return f"b{budget}-s{seed}"


@dataclasses.dataclass(frozen=True)
class SweepConfig:
    """budgets: pretraining steps whose checkpoints start an RL run each (strictly increasing);
    seeds: RL seeds run for every budget; cells: `b{budget}-s{seed}` names to (re)run from scratch
    (empty: every cell not finished yet); cpt_experiment / cpt_set: the pretraining run (a
    registered experiment and `key=value` overrides on its default; its train.steps,
    eval_every, checkpoint_every and keep_checkpoints are set from the budgets); cpt_dir: an
    existing pretraining workdir to use instead (checkpoints and val_loss at every budget);
    bootstrap / ci: resamples and level of the correlation intervals; report_only: run nothing,
    only rewrite the report from the cells on disk (e.g. while the sweep runs elsewhere)."""
    budgets: tuple[int, ...] = (40, 80, 160, 320)
    seeds: tuple[int, ...] = (0, 1)
    cells: tuple[str, ...] = ()
    cpt_experiment: str = "cpt_debug"
    cpt_set: tuple[str, ...] = ()
    cpt_dir: str = ""
    bootstrap: int = 2000
    ci: float = 0.95
    report_only: bool = False

    def __post_init__(self):
        b, s = self.budgets, self.seeds
        _check(len(b) >= 2 and all(x >= 1 for x in b) and list(b) == sorted(set(b)),
               f"sweep.budgets must be >= 2 strictly increasing positive step counts, got {b}")
        _check(len(s) >= 1 and len(set(s)) == len(s) and min(s) >= 0,
               f"sweep.seeds must be distinct non-negative integers, got {s}")
        known = {cell_name(x, y) for x in b for y in s}
        bad = [c for c in self.cells if c not in known]
        _check(not bad, f"sweep.cells {bad} are not cells of this sweep; cells are "
                        f"b<budget>-s<seed> with budgets {b} and seeds {s}")
        _check(all("=" in x for x in self.cpt_set),
               f"sweep.cpt_set entries must be key=value overrides, got {self.cpt_set}")
        _check(self.bootstrap >= 100, f"sweep.bootstrap must be >= 100, got {self.bootstrap}")
        _check(0.5 <= self.ci < 1.0, f"sweep.ci must be in [0.5, 1), got {self.ci}")

    def all_cells(self) -> list[tuple[int, int]]:
        return [(x, y) for x in self.budgets for y in self.seeds]
