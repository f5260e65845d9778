"""Generation of the difficulty ladder's level-1 and level-2 tasks (`ladder_sites.py`) into a pool.

The ordinary generation loop (`generate.Generator`: baselines in batches, candidates interleaved
across modules, parallel sandboxed validation, resumable through the pool's candidate log) runs
once per (level, split) with:
  - sources: every stdlib module of the configured CPythons and every module of
    `env.package_sources`, both sides of `heldout.py`, kept when `ladder_split.split_of` puts
    them on the run's side (train or held-out);
  - candidates: the level's sites of each module (`ladder_sites.sites`), task kind "level1" /
    "level2", the terse bug statement naming the failing tests;
  - validation: `validate.check_candidate` (fails twice before, passes twice after the reference
    fix, within the test-time budget), then the level check (`ladder_check.level_check`: the
    traceback with the "Did you mean" hint at the named line for level 1, no frame at the line
    for level 2);
  - the task's `split` from the module ("train" or "eval"), quotas per (module, level).
`generate_ladder` fills each (level, split) up to its target; a rerun resumes. A pool records the
level-1 keyword sites it was made with (`KEYWORDS_FILE`, `LadderKeywords`) and refuses a run asking
for the other kind.
"""
from __future__ import annotations

import collections
import dataclasses
import pathlib
import random

from composer_jax.config.rl import LadderKeywords
from composer_jax.env.config import EnvConfig, Split
from composer_jax.env.pythons import get_python
from composer_jax.env.tasks import candidates as cands
from composer_jax.env.tasks import ladder_sites, statements
from composer_jax.env.tasks.generate import Generator
from composer_jax.env.tasks.ladder_check import level_check
from composer_jax.env.tasks.ladder_split import TRAIN, split_of
from composer_jax.env.tasks.pool import TaskPool, atomic_write_text
from composer_jax.env.tasks.sources import ModuleSource, discover, discover_packages
from composer_jax.env.tasks.validate import Verdict, check_candidate
from composer_jax.errors import ConfigError

LEVELS = (1, 2)
KEYWORDS_FILE = "ladder_keywords.txt"    # the pool's LadderKeywords value (`check_pool_keywords`)


def level_kind(level: int) -> str:
    """The task kind of a ladder level: "level1", "level2"."""
    return f"level{level}"


def task_level(kind: str) -> int:
    """The ladder level of a task kind: 1, 2, or 3 for every other kind (bug, feature, ...)."""
    return int(kind[len("level"):]) if kind in ("level1", "level2") else 3


@dataclasses.dataclass(frozen=True)
class LadderSpec:
    """What to build: `levels`, per level `train` tasks from training modules and `heldout`
    tasks from held-out modules; the split's `seed` and held-out `fraction` (`ladder_split`);
    `keywords`: which level-1 keyword sites (`config.rl.LadderKeywords`)."""
    levels: tuple[int, ...] = LEVELS
    train: int = 200
    heldout: int = 60
    seed: int = 0
    fraction: float = 0.0
    keywords: LadderKeywords = LadderKeywords.ANY

    def __post_init__(self):
        if not self.levels or not set(self.levels) <= set(LEVELS):
            raise ValueError(f"ladder levels must be a non-empty subset of {LEVELS}, got "
                             f"{self.levels}")
        if self.train < 0 or self.heldout < 0 or not 0 <= self.fraction < 1:
            raise ValueError(f"ladder: train and heldout >= 0 and fraction in [0, 1), got "
                             f"{self.train}, {self.heldout}, {self.fraction}")


def all_sources(cfg: EnvConfig, versions) -> dict[str, list[ModuleSource]]:
    """version -> every module source of both splits (packages first, then stdlib modules with
    the smallest test files), restricted to `cfg.modules` when set."""
    out = {}
    pkgs = []
    for split in Split:
        pkgs += discover_packages(cfg.package_sources, versions, split, cfg.max_module_lines,
                                  cfg.package_dirs)[0]
    for v in versions:
        srcs = []
        if cfg.stdlib_sources:
            for split in Split:
                srcs += discover(get_python(v), split, cfg.max_module_lines)
        found = [s for s in pkgs if s.version == v] + sorted(
            srcs, key=lambda s: (pathlib.Path(s.test_path).stat().st_size, s.module))
        out[v] = [s for s in found if not cfg.modules or s.module in cfg.modules]
    return out


class LadderGenerator(Generator):
    """One (level, split) generation run over a pool (module docstring)."""

    def __init__(self, cfg: EnvConfig, pool_dir: pathlib.Path, level: int, split: str,
                 spec: LadderSpec, progress: bool = True):
        super().__init__(cfg, pool_dir, progress)
        self.level, self.split, self.spec = level, split, spec
        self.kind = level_kind(level)
        sources = all_sources(cfg, self.versions)
        self.todo = {v: [s for s in srcs if split_of(s.module, spec.seed, spec.fraction) == split]
                     for v, srcs in sources.items()}
        self.per_module = collections.Counter((t.python_version, t.module)
                                              for t in self.pool.tasks() if t.kind == self.kind)
        self.sites: dict[str, ladder_sites.LadderSite] = {}

    def task_split(self, c: cands.Candidate) -> str:
        return split_of(c.module, self.spec.seed, self.spec.fraction)

    def _site_stream(self, key):
        """(candidate, mutation) of the module's sites at this level, in a seeded random order."""
        b = self.baselines[key]
        text = pathlib.Path(b.source.module_path).read_text(encoding="utf-8")
        rng = random.Random(f"{self.cfg.task_seed}-{self.kind}-{key}")
        for site in ladder_sites.sites(text, self.level, b.source.version, rng, self.spec.keywords):
            m = site.mutation
            detail = f"{m.describe()}: {site.original or text[m.start:m.end]} -> " \
                     f"{site.typo or m.replacement}"
            c = cands._make(self.kind, cands._digest(m.key), b, mutate_apply(text, m), text,
                            statements.bug_statement, (detail,))
            if not self.pool.processed(c.cid):
                self.sites[c.cid] = site
                yield c, m

    def _candidates(self):
        """Round-robin over usable modules (shuffled each round), one site per module's turn,
        until every module's quota or site list (at most 4x its quota tried) is used up."""
        quota = self.cfg.max_tasks_per_module
        streams, tried = {}, collections.Counter()
        active = True
        while active:
            active = False
            keys = [k for k, b in self.baselines.items() if b.usable]
            self.rng.shuffle(keys)
            for key in keys:
                if self.per_module[key] >= quota or tried[key] >= 4 * quota:
                    continue
                stream = streams.setdefault(key, self._site_stream(key))
                item = next(stream, None)
                if item is not None:
                    tried[key] += 1
                    active = True
                    yield item

    def _validate(self, c: cands.Candidate):
        sx = self.workers.scratch(c.python_version)
        verdict = check_candidate(sx, c.test_names, c.before, c.after, c.after_passing, self.cfg)
        if not verdict.accepted:
            return verdict
        module_file = next(r for r in c.after if c.after[r] != c.before.get(r))
        why = level_check(sx, self.sites[c.cid], module_file, c.before, verdict.fail_to_pass,
                          verdict.messages)
        return Verdict(False, why) if why else verdict


def mutate_apply(text: str, m) -> str:
    """`text` with the one mutation `m` applied."""
    return text[:m.start] + m.replacement + text[m.end:]


def level_counts(pool: TaskPool) -> collections.Counter:
    """(kind, split) -> tasks in the pool."""
    return collections.Counter((t.kind, t.split) for t in pool.tasks())


def pool_keywords(pool_dir) -> LadderKeywords:
    """The keyword sites a ladder pool was made with (`KEYWORDS_FILE`; a pool without it: ANY)."""
    f = pathlib.Path(pool_dir) / KEYWORDS_FILE
    return LadderKeywords(f.read_text().strip()) if f.exists() else LadderKeywords.ANY


def check_pool_keywords(pool_dir: pathlib.Path, keywords: LadderKeywords) -> None:
    """Records `keywords` in a pool without ladder tasks; refuses to add to a pool made with other
    keyword sites (its level-1 tasks would mix two definitions of the level)."""
    has = pool_dir.exists() and any(task_level(t.kind) in LEVELS for t in TaskPool(pool_dir).tasks())
    if has and pool_keywords(pool_dir) is not keywords:
        raise ConfigError(f"the ladder pool {pool_dir} was made with rl.task.ladder_keywords="
                          f"{pool_keywords(pool_dir).value}, this run asks for {keywords.value}: "
                          f"set env.pool_dir to another directory (or ladder_keywords to "
                          f"{pool_keywords(pool_dir).value})")
    if not has:
        pool_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(pool_dir / KEYWORDS_FILE, keywords.value)


def generate_ladder(cfg: EnvConfig, pool_dir, spec: LadderSpec, progress: bool = True) -> dict:
    """Fills the pool at `pool_dir` up to `spec`'s targets per (level, split); returns
    {"level1/train": {"made", "target", "seconds", "rejections", ...}, ...} for this call's runs
    (a run that ends short says so in its entry; nothing raises for a shortfall)."""
    pool_dir = pathlib.Path(pool_dir)
    check_pool_keywords(pool_dir, spec.keywords)
    out = {}
    for level in spec.levels:
        for split, want in ((TRAIN, spec.train), ("eval", spec.heldout)):
            have = level_counts(TaskPool(pool_dir))[(level_kind(level), split)]
            name = f"{level_kind(level)}/{split}"
            if have >= want:
                out[name] = {"made": 0, "have": have, "target": want}
                continue
            total = len(TaskPool(pool_dir))
            run_cfg = dataclasses.replace(cfg, num_tasks=total + want - have)
            summary = LadderGenerator(run_cfg, pool_dir, level, split, spec, progress).run()
            now = level_counts(TaskPool(pool_dir))[(level_kind(level), split)]
            out[name] = {"made": now - have, "have": now, "target": want,
                         "seconds": summary["seconds"],
                         "modules_usable": summary["modules_usable"],
                         "candidates": summary["stats"].get("candidates", 0),
                         "rejections": summary["rejections"]}
    return out
