"""Offline task generation: module sources -> baselines -> candidates -> validated tasks in a pool.

Sources are stdlib modules of each configured CPython and the modules of the packages named in
`env.package_sources` (`sources.py`). They are taken in batches (package modules first, then stdlib
modules with the smallest test files, so test runs stay short); each batch is baselined in the
sandbox (the unmodified module's tests; when they are slow only their fastest test classes are
kept; modules whose tests do not import the workspace copy, or that have too few addressable
passing tests, are dropped). Candidates of the configured kinds are then interleaved across
modules and validated in parallel (`validate.py`) until `num_tasks` tasks are in the pool or the
batch runs dry, in which case the next batch is baselined. Every processed candidate is logged, so
a rerun resumes where it stopped.

Kinds (`env.kinds`, all from this one entry point, `generate_pool`): bug and multi_bug (`mutate.py`),
feature, migration (`candidates.py`), refactor (`refactor.py`) and large_feature
(`large_feature.py`). Every task records `lines_changed` (the reference patch's changed lines); the
manifest and the summary give the median per kind. `env.modules` restricts the sources to named
modules (tests and small evaluation pools).

A run that ends with no task, or with fewer than `env.min_task_fraction` of `num_tasks`, raises
`GenerationError`: the most common reasons modules were unusable and candidates were rejected, with
counts, and what to do (the pool keeps what was made; a rerun resumes).
"""
from __future__ import annotations

import collections
import concurrent.futures as cf
import dataclasses
import itertools
import json
import logging
import pathlib
import random
import re
import threading
import time

from tqdm.auto import tqdm

from composer_jax.env import secret
from composer_jax.env.config import EnvConfig
from composer_jax.env.graded_run import module_name
from composer_jax.env.pythons import find_pythons, get_python
from composer_jax.env.sandbox import resolve_backend
from composer_jax.env.tasks import candidates as cands
from composer_jax.env.tasks import holdback
from composer_jax.env.tasks.pool import TaskPool, atomic_write_text
from composer_jax.env.tasks.reference_check import reference_problem
from composer_jax.env.tasks.sources import ModuleSource, discover, discover_packages
from composer_jax.env.tasks.task import Task, unified_patch
from composer_jax.env.tasks.validate import addressable, check_candidate, scratch
from composer_jax.env.workspace import open_workspace
from composer_jax.errors import ComposerError

MIN_PASSING = 5
BATCH_PER_VERSION = 12
# The order in which a module's turn tries kinds (rotated per turn): bugs are the most common.
KIND_ORDER = ("bug", "feature", "refactor", "bug", "large_feature", "multi_bug", "migration", "bug",
              "feature", "refactor", "large_feature")
# Refactors and large features legitimately break many tests at once (a renamed import, a class
# without methods): they may have this many times max_fail_to_pass failing tests.
WIDE_KINDS = {"refactor": 4, "large_feature": 4}


class GenerationError(ComposerError):
    """Generation made no task, or far fewer than asked; `summary` is the run's summary dict."""

    def __init__(self, message: str, summary: dict):
        super().__init__(message)
        self.summary = summary


def reason_key(reason: str) -> str:
    """A reason with numbers and paths blanked, on one line, so that equal causes count together."""
    one = " ".join(reason.split())
    one = re.sub(r"(/[\w.+-]+)+", "PATH", one)
    return re.sub(r"\d+(\.\d+)?", "N", one)[:100]


def top_reasons(reasons, n: int = 5) -> dict[str, int]:
    """The `n` most common reason keys with their counts."""
    return dict(collections.Counter(reason_key(r) for r in reasons).most_common(n))


def shortfall_message(summary: dict, cfg: EnvConfig, pool_dir) -> str:
    """Why a generation run ended short, and what to do."""
    got, asked = summary["num_tasks"], cfg.num_tasks
    lines = [f"env_generate made {got} of the {asked} tasks asked for (env.num_tasks; below "
             f"env.min_task_fraction={cfg.min_task_fraction:g} of it is an error) in {pool_dir}.",
             f"modules baselined: {summary['modules_baselined']}, usable: "
             f"{summary['modules_usable']} (usable: the module's own tests pass in the sandbox); "
             f"candidates tried: {summary['stats'].get('candidates', 0)}"]
    for title, key in (("modules were unusable", "baseline_failures"),
                       ("candidates were rejected", "rejections")):
        if summary[key]:
            lines.append(f"most common reasons {title}:")
            lines += [f"  {count:6d}  {why}" for why, count in summary[key].items()]
            example = summary.get("baseline_failure_example", "")
            if key == "baseline_failures" and example and example not in summary[key]:
                lines.append(f"  e.g. {example}")
    if summary["modules_baselined"] == 0:
        lines.append(f"what to do: no source module was found for env.python_versions="
                     f"{','.join(cfg.python_versions)} (CPythons found: {sorted(find_pythons())}; "
                     f"each needs its test/ package); check env.modules, env.stdlib_sources and "
                     f"env.package_sources, or set CJ_PYTHON_PREFIXES")
    elif summary["modules_usable"] == 0:
        lines.append("what to do: no module's tests pass in the sandbox, so the sandbox or the "
                     "interpreters are broken: run `python launch.py --experiment=env_doctor` "
                     "(backend, namespaces, interpreters and a one-task smoke test)")
    elif any("too slow" in why for why in list(summary["rejections"])[:1]):
        lines.append("what to do: most candidates' tests ran slower than env.max_task_test_seconds "
                     f"({cfg.max_task_test_seconds:g}s): on a loaded machine rerun when it is "
                     "quieter (the run resumes), or raise env.max_task_test_seconds and "
                     "env.max_test_file_seconds")
    else:
        lines.append("what to do: the sources ran dry: raise env.max_tasks_per_module, add "
                     "env.python_versions or env.package_sources, widen env.kinds or env.modules, "
                     "or ask for fewer (env.num_tasks, env.min_task_fraction)")
    lines.append("the pool keeps the tasks made; rerunning resumes")
    return "\n".join(lines)


def fast_classes(class_times: dict, passing: frozenset, budget_s: float) -> tuple[tuple, frozenset]:
    """(the fastest test classes holding passing tests whose summed time fits `budget_s`, the
    passing test ids in them)."""
    with_passing = {t.rsplit(".", 1)[0] for t in passing}
    chosen, total = set(), 0.0
    for cls, seconds in sorted(class_times.items(), key=lambda kv: (kv[1], kv[0])):
        if cls not in with_passing:
            continue
        if total + seconds > budget_s:
            break
        chosen.add(cls)
        total += seconds
    return tuple(sorted(chosen)), frozenset(t for t in passing if t.rsplit(".", 1)[0] in chosen)


def baseline(sx, src: ModuleSource, cfg: EnvConfig) -> cands.Baseline:
    """Runs the unmodified module's tests; decides whether the module is usable. Tests slower than
    `max_test_file_seconds` are trimmed to their fastest classes (half that budget), run again."""
    sx.sync(src.files(pathlib.Path(src.module_path).read_text(encoding="utf-8")))
    run = sx.run(list(src.test_names), modules=(src.module,), timeout_s=cfg.baseline_timeout_s)
    where = run.modules.get(src.module) or ""
    passing = frozenset(t for t, s in run.results.items()
                        if s == "pass" and addressable(t, src.test_names))
    tests, reason = (), ""
    if run.ok and run.duration_s > cfg.max_test_file_seconds:
        tests, passing = fast_classes(run.class_times, passing, cfg.max_test_file_seconds / 2)
        if tests:  # keep the ids that also pass when only those classes run
            again = sx.run(list(tests), timeout_s=cfg.baseline_timeout_s)
            passing = frozenset(t for t in passing if again.passed(t))
    if not run.ok:
        last = [ln.strip() for ln in run.detail.splitlines() if ln.strip()] or ["no output"]
        reason = "baseline run failed: " + last[-1][-160:]  # e.g. the exception line
    elif not where.endswith("/" + src.module_file) or not where.startswith(sx.sandbox.workdir):
        reason = f"module imported from {where!r}, not the workspace"
    elif len(passing) < MIN_PASSING:
        reason = (f"tests too slow ({run.duration_s:.2f}s)" if tests or
                  run.duration_s > cfg.max_test_file_seconds else
                  f"only {len(passing)} addressable passing tests")
    return cands.Baseline(src, passing, run.duration_s, not reason, reason, tests)


class _Workers:
    """Thread-local sandbox scratch dirs, one per (thread, python version)."""

    def __init__(self, cfg: EnvConfig, backend):
        self.cfg, self.backend = cfg, backend
        self._local = threading.local()
        self._all = []
        self._lock = threading.Lock()

    def scratch(self, version: str):
        d = self._local.__dict__.setdefault("sx", {})
        if version not in d:
            cm = scratch(get_python(version), self.backend, self.cfg)
            d[version] = cm.__enter__()
            with self._lock:
                self._all.append(cm)
        return d[version]

    def close(self):
        for cm in self._all:
            cm.__exit__(None, None, None)


def _load_baselines(pool: TaskPool, version: str) -> dict:
    p = pool.root / "baselines" / f"{version}.json"
    return json.loads(p.read_text()) if p.exists() else {}


def _save_baselines(pool: TaskPool, version: str, data: dict) -> None:
    atomic_write_text(pool.root / "baselines" / f"{version}.json", json.dumps(data, indent=0))


class Generator:
    """One generation run over a pool directory (see the module docstring)."""

    def __init__(self, cfg: EnvConfig, pool_dir: pathlib.Path, progress: bool = True):
        self.cfg = cfg
        self.pool = TaskPool(pool_dir)
        self.backend = resolve_backend(cfg.sandbox_backend)
        self.rng = random.Random(cfg.task_seed)
        self.progress = progress
        self.versions = sorted(cfg.python_versions, key=lambda v: tuple(map(int, v.split("."))))
        pkgs, self.packages_missing = discover_packages(cfg.package_sources, self.versions,
                                                        cfg.split, cfg.max_module_lines,
                                                        cfg.package_dirs)
        self.todo = {}
        for v in self.versions:
            srcs = (discover(get_python(v), cfg.split, cfg.max_module_lines)
                    if cfg.stdlib_sources else [])
            self.todo[v] = [s for s in pkgs if s.version == v] + sorted(
                srcs, key=lambda s: (pathlib.Path(s.test_path).stat().st_size, s.module))
            if cfg.modules:
                self.todo[v] = [s for s in self.todo[v] if s.module in cfg.modules]
        self.baselines: dict[tuple[str, str], cands.Baseline] = {}
        self.per_module = collections.Counter((t.python_version, t.module) for t in self.pool.tasks())
        self.accepted_mutations = collections.defaultdict(list)
        self.attempts = collections.Counter()
        self.streams: dict = {}
        self.stats = collections.Counter()
        self.rejected: list[str] = []   # this run's rejection reasons
        self.workers = _Workers(cfg, self.backend)

    # -- baselines ------------------------------------------------------------------------------
    def _baseline_batch(self, ex: cf.Executor) -> int:
        """Baselines the next batch of modules of every version; returns how many were added."""
        jobs = {}
        for v in self.versions:
            cache = _load_baselines(self.pool, v)
            batch, self.todo[v] = self.todo[v][:BATCH_PER_VERSION], self.todo[v][BATCH_PER_VERSION:]
            for src in batch:
                if src.module in cache:
                    c = cache[src.module]
                    self.baselines[(v, src.module)] = cands.Baseline(
                        src, frozenset(c["passing"]), c["duration_s"], c["usable"], c["reason"],
                        tuple(c.get("tests", ())))
                else:
                    jobs[ex.submit(lambda s=src: baseline(self.workers.scratch(s.version), s, self.cfg))] = src
        for fut in cf.as_completed(jobs):
            b = fut.result()
            self.baselines[(b.source.version, b.source.module)] = b
        for v in self.versions:
            cache = _load_baselines(self.pool, v)
            for (ver, mod), b in self.baselines.items():
                if ver == v:
                    cache[mod] = {"passing": sorted(b.passing), "duration_s": b.duration_s,
                                  "usable": b.usable, "reason": b.reason, "tests": list(b.tests)}
            _save_baselines(self.pool, v, cache)
        return len(jobs)

    # -- candidates -----------------------------------------------------------------------------
    def _module_streams(self, key):
        if key not in self.streams:
            b = self.baselines[key]
            rng = random.Random(f"{self.cfg.task_seed}-{key}")
            self.streams[key] = {
                "bug": cands.bug_candidates(b, rng), "feature": cands.feature_candidates(b, rng),
                "refactor": cands.refactor_candidates(b, rng),
                "large_feature": cands.large_feature_candidates(b, rng,
                                                                self.cfg.large_feature_min_lines),
                "rng": rng}
        return self.streams[key]

    def _candidates(self):
        """Interleaves kinds across usable modules; ends when every stream is exhausted."""
        kinds = [k for k in KIND_ORDER if k in self.cfg.kinds]
        quota = self.cfg.max_tasks_per_module
        migrations = self._migration_candidates() if "migration" in self.cfg.kinds else iter(())
        active = True
        while active:
            active = False
            keys = [k for k, b in self.baselines.items() if b.usable]
            self.rng.shuffle(keys)
            for key in keys:
                if self.per_module[key] >= quota:
                    continue
                turn = self.attempts[(key, "turn")]
                self.attempts[(key, "turn")] += 1
                for kind in kinds[turn % len(kinds):] + kinds[:turn % len(kinds)]:
                    c = self._next(kind, key, migrations)
                    if c is not None:
                        active = True
                        yield c
                        break

    def _next(self, kind, key, migrations):
        limit = 4 * self.cfg.max_tasks_per_module
        if kind == "migration":
            return next(migrations, None)
        if self.attempts[(key, kind)] >= limit:
            return None
        s = self._module_streams(key)
        if kind == "multi_bug":
            acc = self.accepted_mutations[key]
            if len(acc) < 2:
                return None
            self.attempts[(key, kind)] += 1
            c = cands.multi_bug_candidate(self.baselines[key], acc, s["rng"])
            return c if c is not None and not self.pool.processed(c.cid) else None
        for item in s[kind]:
            c = item[0] if isinstance(item, tuple) else item
            if self.pool.processed(c.cid):
                continue
            self.attempts[(key, kind)] += 1
            return item
        return None

    def _migration_candidates(self):
        """Module from an older installed CPython (nearest versions first), tests from a newer one."""
        vkey = lambda v: tuple(map(int, v.split(".")))  # noqa: E731
        installed = sorted((v for v in find_pythons() if vkey(v) >= (3, 8)), key=vkey)
        pairs = [(o, n) for n in self.versions for o in installed if vkey(o) < vkey(n)]
        pairs.sort(key=lambda p: (installed.index(p[1]) - installed.index(p[0]), vkey(p[1])))
        seen = set()
        for old_v, new_v in pairs:
            olds = {s.module: s for s in discover(get_python(old_v), self.cfg.split,
                                                   self.cfg.max_module_lines)}
            for (ver, mod), b in sorted(self.baselines.items()):
                if ver != new_v or not b.usable or b.source.package or mod not in olds:
                    continue
                text = pathlib.Path(olds[mod].module_path).read_bytes()
                if (new_v, mod, text) in seen:
                    continue  # the same old text as a nearer version: same task
                seen.add((new_v, mod, text))
                c = cands.migration_candidate(olds[mod], b, self.cfg.max_migration_lines)
                if c is not None and not self.pool.processed(c.cid):
                    yield c

    # -- validation -----------------------------------------------------------------------------
    def _validate(self, c: cands.Candidate):
        sx = self.workers.scratch(c.python_version)
        cap = self.cfg.max_fail_to_pass * WIDE_KINDS.get(c.kind, 1)
        return check_candidate(sx, c.test_names, c.before, c.after, c.after_passing, self.cfg,
                               max_fail_to_pass=cap)

    def _accept(self, c: cands.Candidate, verdict) -> str | None:
        """Adds the task; then drops it again, returning why, when the grader does not resolve its
        reference fix (`reference_check`)."""
        edit = tuple(sorted(r for r in c.after if c.after[r] != c.before.get(r)))
        patch, changed = unified_patch({r: c.before[r] for r in edit}, {r: c.after[r] for r in edit})
        tests = {r: c.before[r] for r in c.test_files if r in c.before}
        modules = {module_name(r): r for r in tests}
        held = holdback.choose(verdict.fail_to_pass, tests, modules, random.Random(c.cid))
        visible = tuple(t for t in verdict.fail_to_pass if t not in held)
        task = Task(task_id=c.cid, kind=c.kind, split=self.task_split(c),
                    python_version=c.python_version, module=c.module,
                    problem_statement=c.statement(visible, {t: verdict.messages.get(t, "")
                                                            for t in visible}),
                    fail_to_pass=verdict.fail_to_pass, pass_to_pass=verdict.pass_to_pass,
                    edit_files=edit, test_files=c.test_files, reference_patch=patch,
                    lines_changed=changed, source_version=c.source_version,
                    test_version=c.test_version, mutations=c.mutations, origin=c.origin,
                    package=c.package, package_version=c.package_version, held_back=held)
        snapshot = {**c.before, **holdback.strip(tests, held, modules)} if held else c.before
        self.pool.add(task, snapshot, {r: c.after[r] for r in edit},
                      grading_tests=tests if held else {})
        self._secret_cases(task)
        why = reference_problem(task, self.pool.task_dir(task.task_id), self.cfg)
        if why:
            self.pool.remove(task.task_id)
        return why

    def task_split(self, c: cands.Candidate) -> str:
        """The `split` recorded on an accepted candidate's task (the ladder splits by module)."""
        return self.cfg.split.value

    def _secret_cases(self, task: Task) -> None:
        """Records the task's secret cases now (trusted side, outside any sandbox the agent gets);
        a failure only logs: the grader builds them on first use."""
        d = self.pool.task_dir(task.task_id)
        try:
            with open_workspace(d / "snapshot", self.cfg, python_version=task.python_version,
                                task=task) as ws:
                secret.build(ws, task, d)
        except Exception as exc:  # noqa: BLE001 - a sandbox failure must not stop generation
            logging.getLogger(__name__).warning("secret cases of %s not built: %s",
                                                task.task_id, exc)

    def _finish(self, c: cands.Candidate, m, verdict, target: int, bar) -> None:
        """Adds an accepted candidate to the pool (within quotas) and logs the outcome."""
        key = (c.python_version, c.module)
        self.stats["candidates"] += 1
        added = (verdict.accepted and len(self.pool) < target
                 and self.per_module[key] < self.cfg.max_tasks_per_module)
        if added:
            why = self._accept(c, verdict)
            if why:  # the grader does not resolve its reference fix: a rejection like the others
                added, verdict = False, dataclasses.replace(verdict, accepted=False, reason=why)
        if added:
            self.per_module[key] += 1
            if m is not None:
                self.accepted_mutations[key].append(m)
            self.stats["accepted"] += 1
            bar.update(1)
        else:
            why = "over quota" if verdict.accepted else verdict.reason
            self.stats["rejected: " + re.sub(r"\d+", "N", why.split(":")[0])] += 1
            self.rejected.append(why)
        self.pool.record(c.cid, added, "ok" if added else verdict.reason)
        bar.set_postfix(tried=self.stats["candidates"], refresh=False)

    def _validate_stream(self, ex: cf.Executor, target: int, bar) -> None:
        """Validates candidates of the current modules in parallel until the target or dry."""
        stream = self._candidates()
        inflight = {}
        while len(self.pool) < target:
            while len(inflight) < 2 * self.cfg.workers:
                item = next(stream, None)
                if item is None:
                    break
                c, m = item if isinstance(item, tuple) else (item, None)
                inflight[ex.submit(self._validate, c)] = (c, m)
            if not inflight:
                return
            done, _ = cf.wait(inflight, return_when=cf.FIRST_COMPLETED)
            for fut in done:
                c, m = inflight.pop(fut)
                self._finish(c, m, fut.result(), target, bar)
        for fut in inflight:  # unfinished work is simply redone by a later (resumed) run
            fut.cancel()

    def run(self) -> dict:
        """Generates until the pool holds `num_tasks` tasks (or sources run out); returns stats."""
        start = time.monotonic()
        target = self.cfg.num_tasks
        bar = tqdm(total=target, initial=min(len(self.pool), target), desc="env tasks",
                   disable=not self.progress, unit="task")
        try:
            with cf.ThreadPoolExecutor(self.cfg.workers) as ex:
                while len(self.pool) < target and any(self.todo.values()):
                    self._baseline_batch(ex)
                    self._validate_stream(ex, target, bar)
        finally:
            bar.close()
            self.workers.close()
        manifest = self.pool.write_manifest()
        usable = sum(b.usable for b in self.baselines.values())
        return {"num_tasks": manifest["num_tasks"], "kinds": manifest["kinds"],
                "versions": manifest["versions"], "sources": manifest["sources"],
                "median_lines_changed": manifest["median_lines_changed"],
                "packages_missing": self.packages_missing, "seconds": time.monotonic() - start,
                "modules_baselined": len(self.baselines), "modules_usable": usable,
                "baseline_failures": top_reasons(b.reason for b in self.baselines.values()
                                                 if not b.usable),
                "baseline_failure_example": next((" ".join(b.reason.split())[:300]
                                                  for b in self.baselines.values()
                                                  if not b.usable), ""),
                "rejections": top_reasons(self.rejected),
                "stats": dict(self.stats)}


def generate_pool(cfg: EnvConfig, pool_dir: pathlib.Path, progress: bool = True) -> dict:
    """Builds (or resumes) the task pool in `pool_dir`; returns a summary dict. GenerationError
    (carrying the summary) when the pool ends empty or below `env.min_task_fraction`."""
    summary = Generator(cfg, pathlib.Path(pool_dir), progress).run()
    if summary["num_tasks"] == 0 or summary["num_tasks"] < cfg.min_task_fraction * cfg.num_tasks:
        raise GenerationError(shortfall_message(summary, cfg, pool_dir), summary)
    return summary
