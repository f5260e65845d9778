"""Secret cases: input -> reference-output pairs the graded code must reproduce, compared outside.

Built once per task by the trusted side (`build`, at generation or on first grading), stored in
`<task_dir>/secret_cases.json` - the task directory is never mounted in a sandbox:
  1. targets: the public module-level functions and public methods of module-level classes of
     the edit files whose code the reference fix changes, or that call (transitively, by name or
     as `self.m`) a changed one (`targets`);
  2. inputs: every distinct call of a target with plain-data arguments (for a method: on an
     instance whose constructor got plain data; the case rebuilds it) during the reference's run
     of the task's tests (`secret_child.py harvest`), plus perturbations of each argument
     (`perturb`, seeded) - inputs no test shows;
  3. outputs: the reference computes each case REFERENCE_RUNS times, each in a fresh process
     (cases that time out or return anything but plain data are dropped; when any case of a target
     differed between runs, the function is not deterministic and agreeing runs of one of its
     values may be luck - `secrets.randbelow(2)` agrees twice half the time - so of its cases only
     those raising the same exception in every run are kept: `randbelow(-4)`'s ValueError) and the
     unfixed snapshot once (`discriminating`: the cases it gets wrong); of the cases kept, only
     those whose output does not depend on the cases run before them stay (`order_free`: `check`
     runs fewer cases, in another order, than the runs that recorded the outputs).
At grading (`check`), a fresh process in a fresh sandbox over the graded tree imports the agent's
code, receives only the inputs and prints the outputs; the parent compares them in a bounded
process (`bounded.compare_outputs`). Passing therefore needs correct outputs on inputs the agent
never saw. Tasks whose changed code is reached only with objects that are not plain data get no
cases, and `secret_cases.json` says why.
"""
from __future__ import annotations

import ast
import dataclasses
import json
import logging
import os
import pathlib
import random
import secrets
import shutil
import tempfile
import threading
import time
import types

from composer_jax.env.bounded import EvaluationOverrun, compare_outputs
from composer_jax.env.config import SandboxBackend
from composer_jax.env.graded_run import (budget_bytes, copy_tree, module_name,
                                         run_with_one_retry, slowdown)
from composer_jax.env.sandbox import allocate_uid, reap_uid
from composer_jax.env.secret_child import opaque
from composer_jax.env.tasks.pool import atomic_write_text
from composer_jax.env.tasks.task import Task, grading_test_files
from composer_jax.env.verdict import read_case_lines
from composer_jax.env.workspace import scratch_parent

HERE = pathlib.Path(__file__).resolve().parent
CHILD = HERE / "secret_child.py"
CANON = HERE / "graded_unittest.py"
FILE = "secret_cases.json"
VERSION = 9
MAX_HARVEST = 200
MAX_CASES = 48
CASE_BYTES = 4096
CALL_SECONDS = 2.0
REFERENCE_RUNS = 3
INPUT_KEYS = ("f", "init", "args", "kwargs")   # "init": [args, kwargs] of a method's instance
_LOCK = threading.Lock()
_LOCKS: dict[str, threading.Lock] = {}


@dataclasses.dataclass(frozen=True)
class SecretResult:
    """total: cases checked; passed; detail: why the check could not run (else "")."""
    total: int
    passed: int
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.passed == self.total and not self.detail


def _functions(text: str) -> dict[str, ast.FunctionDef]:
    """qualname -> definition of the module-level functions ("f") and of the methods of
    module-level classes ("C.m")."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return {}
    out = {}
    for n in tree.body:
        if isinstance(n, ast.FunctionDef):
            out[n.name] = n
        elif isinstance(n, ast.ClassDef):
            out.update({f"{n.name}.{m.name}": m for m in n.body if isinstance(m, ast.FunctionDef)})
    return out


def _calls(qual: str, fn: ast.FunctionDef) -> set[str]:
    """What `fn` calls by name: module functions, and `self.m(...)` as "C.m" in a method of C."""
    cls = qual.split(".")[0] + "." if "." in qual else None
    out = set()
    for n in ast.walk(fn):
        if isinstance(n, ast.Call):
            if isinstance(n.func, ast.Name):
                out.add(n.func.id)
            elif cls and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name) \
                    and n.func.value.id == "self":
                out.add(cls + n.func.attr)
    return out


SKIP_DECORATORS = frozenset({"property", "contextmanager", "staticmethod", "classmethod",
                             "abstractmethod", "cached_property"})


NOT_CALLED = frozenset({"__init__", "__new__", "__del__", "__init_subclass__", "__repr__",
                        "__str__", "__hash__", "__eq__", "__ne__", "__iter__", "__enter__",
                        "__exit__", "__getattr__", "__getattribute__", "__setattr__"})


def _public(name: str) -> bool:
    """Not private; special methods count as public (`obj[k]` calls `__getitem__`)."""
    dunder = name.startswith("__") and name.endswith("__")
    return not name.startswith("_") or (dunder and name not in NOT_CALLED)


def _callable_as_data(qual: str, fn: ast.FunctionDef) -> bool:
    """Public, neither a property/static/class method nor a generator."""
    return (all(_public(p) for p in qual.split("."))
            and not any(isinstance(d, ast.Name) and d.id in SKIP_DECORATORS
                        or isinstance(d, ast.Attribute) and d.attr in ("setter", "getter")
                        for d in fn.decorator_list)
            and not any(isinstance(x, (ast.Yield, ast.YieldFrom)) for x in ast.walk(fn)))


def targets(before: dict[str, str], after: dict[str, str]) -> list[tuple[str, str]]:
    """(module, "function" or "Class.method") pairs to build cases for: public ones the fix
    changes, that call a changed one, or whose class's constructor changed (module docstring,
    step 1)."""
    out = []
    for rel in sorted(after):
        if not rel.endswith(".py"):
            continue
        old, new = _functions(before.get(rel, "")), _functions(after[rel])
        changed = {n for n, f in new.items()
                   if n not in old or ast.dump(old[n]) != ast.dump(f)}
        built = {n.split(".")[0] + "." for n in changed if n.endswith(".__init__")}
        changed |= {n for n in new if n.startswith(tuple(built))}  # state the methods read
        grew = True
        while grew:
            callers = {n for n, f in new.items() if n not in changed and _calls(n, f) & changed}
            grew = bool(callers)
            changed |= callers
        out += [(module_name(rel), n) for n in sorted(changed) if _callable_as_data(n, new[n])]
    return out


def _tweak(c: list, rng: random.Random) -> list | None:
    """A nearby value of the same type as canonical `c` (None when it has none)."""
    tag = c[0]
    if tag == "i":
        x = int(c[1])
        return ["i", str(rng.choice([x + 1, x - 1, -x, 0, 2 * x + 1, x + rng.randint(2, 9)]))]
    if tag == "f":
        x = float(c[1])
        return ["f", repr(rng.choice([x * 1.5, -x, x + 0.25, x / 3.0, 0.0]))]
    if tag == "B":
        return ["B", not c[1]]
    if tag == "s":
        s = c[1]
        if not s:
            return ["s", rng.choice(["a", " ", "0"])]
        i = rng.randrange(len(s))
        return ["s", rng.choice([s[::-1], s[:i] + s[i + 1:], s[:i] + s[i] + s[i:], s.swapcase(),
                                 s + s[:1], s[1:] + s[:1]])]
    if tag in ("y", "Y"):
        b = bytes.fromhex(c[1])
        if not b:
            return [tag, "61"]
        return [tag, rng.choice([b[::-1], b[1:], b + b[:1]]).hex()]
    if tag in ("l", "t", "S", "F"):
        items = list(c[1])
        if not items:
            return None
        i = rng.randrange(len(items))
        choice = rng.randrange(3)
        if choice == 0:
            return [tag, items[::-1]]
        if choice == 1:
            return [tag, items[:i] + items[i + 1:]]
        sub = _tweak(items[i], rng)
        return None if sub is None else [tag, items[:i] + [sub] + items[i + 1:]]
    return None


def perturb(case: dict, rng: random.Random, n: int = 4) -> list[dict]:
    """Up to `n` variants of a harvested call, each with one argument changed (`_tweak`)."""
    out = []
    slots = [("args", i) for i in range(len(case["args"]))] + \
            [("kwargs", i) for i in range(len(case["kwargs"]))] + \
            [("init", i) for i in range(len(case.get("init", [[]])[0]))]
    for _ in range(3 * n):
        if not slots or len(out) >= n:
            break
        where, i = rng.choice(slots)
        new = json.loads(json.dumps(case))
        if where == "args":
            t = _tweak(new["args"][i], rng)
            if t is None:
                continue
            new["args"][i] = t
        elif where == "init":
            t = _tweak(new["init"][0][i], rng)
            if t is None:
                continue
            new["init"][0][i] = t
        else:
            t = _tweak(new["kwargs"][i][1], rng)
            if t is None:
                continue
            new["kwargs"][i][1] = t
        if new != case and new not in out and len(json.dumps(new)) <= CASE_BYTES:
            out.append(new)
    return out


def _python_argv(ws) -> list[str]:
    if ws.backend == SandboxBackend.BWRAP and (pathlib.Path(ws.python.prefix) / "bin" /
                                               "python").exists():
        return ["python"]
    return [ws.python.executable]


def run_child(ws, task: Task, snapshot: pathlib.Path, files: dict, request: dict,
              timeout_s: float, max_output_bytes: int = 16 << 20) -> tuple[str, bool]:
    """(output, timed_out) of `secret_child.py` on a fresh copy of `snapshot` with `files`
    applied, in a fresh sandbox (its own uid) whose installed task files show that tree."""
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="cj-case-", dir=scratch_parent()))
    os.chmod(tmp, 0o711)
    try:
        uid = allocate_uid()
        tree = tmp / "ws"
        staged = {".cj_case/secret_child.py": CHILD.read_bytes(),
                  ".cj_case/graded_unittest.py": CANON.read_bytes()}
        copy_tree(pathlib.Path(snapshot), {**files, **staged}, tree, uid)
        sandbox = ws.new_sandbox(tree, uid, scratch=tmp / "hidden")
        try:
            cmd = " ".join([*_python_argv(ws), ".cj_case/secret_child.py"])
            fresh = sorted({module_name(r).split(".")[0] for r in task.edit_files})
            r = sandbox.run(cmd, timeout_s=timeout_s, max_output_bytes=max_output_bytes,
                            stdin_data=(json.dumps({**request, "fresh": fresh}) + "\n").encode())
        finally:
            sandbox.close()
            reap_uid(uid)
        return r.output, r.timed_out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _outputs(ws, task, snapshot, files, cases, timeout_s) -> tuple[list, float, int]:
    """(the output each case got (None where none came back), seconds, bytes written) on trusted
    code (the reference or the unfixed snapshot: no agent code runs here)."""
    nonce = secrets.token_hex(16)
    start = time.monotonic()
    out, _ = run_child(ws, task, snapshot, files, {"op": "run", "nonce": nonce, "cases": cases,
                                                    "call_seconds": CALL_SECONDS}, timeout_s)
    got, _ = read_case_lines(out, nonce)
    return ([got.get(i, [None])[0] for i in range(len(cases))], time.monotonic() - start,
            len(out))


def _usable(out) -> bool:
    if not isinstance(out, list) or not out:
        return False
    if out[0] == "e":
        return "<timeout>" not in out[1] and "<bad input>" not in out[1]
    return not opaque(out[1]) and not any(opaque(c) for c in out[2])


def build(ws, task: Task, task_dir: pathlib.Path, timeout_s: float | None = None) -> dict:
    """Builds (or loads) the task's secret cases (module docstring); returns the stored dict:
    {"version", "targets", "cases": [{"f", "init"?, "args", "kwargs", "out", "seen",
    "discriminating"}], "seconds", "output_bytes", "why" (when there are none)}. Concurrent
    callers for one task (a group of episodes) build once."""
    key = str(pathlib.Path(task_dir).resolve())
    with _LOCK:
        lock = _LOCKS.setdefault(key, threading.Lock())
    with lock:
        return _build(ws, task, pathlib.Path(task_dir), timeout_s)


def _build(ws, task: Task, task_dir: pathlib.Path, timeout_s: float | None) -> dict:
    task_dir = pathlib.Path(task_dir)
    path = task_dir / FILE
    try:
        data = json.loads(path.read_text())
        if data.get("version") == VERSION:
            return data
    except (OSError, ValueError):
        pass
    timeout_s = timeout_s or ws.config.test_timeout_s
    snapshot, sol = task_dir / "snapshot", task_dir / "solution"
    solution = {r: (sol / r).read_bytes() for r in task.edit_files if (sol / r).is_file()}
    before = {r: (snapshot / r).read_text(encoding="utf-8", errors="replace")
              for r in task.edit_files if (snapshot / r).is_file()}
    after = {r: b.decode("utf-8", "replace") for r, b in solution.items()}
    found = targets(before, after)
    data = {"version": VERSION, "targets": [list(t) for t in found], "cases": []}
    if not found:
        data["why"] = "the fix changes no public function or method (private or special ones only)"
        return _save(path, data)
    tests = grading_test_files(task, task_dir)
    nonce = secrets.token_hex(16)
    out, _ = run_child(ws, task, snapshot, {**tests, **solution},
                       {"op": "harvest", "nonce": nonce, "targets": data["targets"],
                        "tests": list(task.test_ids), "max_calls": MAX_HARVEST}, timeout_s)
    harvested = _harvested(out, nonce)
    rng = random.Random(task.task_id)
    seen = {json.dumps(c, sort_keys=True) for c in harvested}
    fresh = [p for c in harvested for p in perturb(c, rng)
             if json.dumps(p, sort_keys=True) not in seen]
    pool = list({json.dumps(c, sort_keys=True): c for c in harvested + fresh}.values())
    rng.shuffle(pool)
    pool = pool[:4 * MAX_CASES]
    if not pool:
        data["why"] = ("the tests call the changed functions with no plain-data arguments (or on "
                       "objects not built from plain data)")
        return _save(path, data)
    ref1, seconds, size = _outputs(ws, task, snapshot, {**tests, **solution}, pool, timeout_s)
    more = [_outputs(ws, task, snapshot, {**tests, **solution}, pool, timeout_s)[0]
            for _ in range(REFERENCE_RUNS - 1)]
    bug, _, _ = _outputs(ws, task, snapshot, tests, pool, timeout_s)
    runs = [list(outs) for outs in zip(ref1, *more)]   # per case: its output in every run
    varying = {tuple(c["f"]) for c, outs in zip(pool, runs)
               if None not in outs and any(o != outs[0] for o in outs)}
    keep = []
    for c, outs, u in zip(pool, runs, bug):
        a = outs[0]
        steady = tuple(c["f"]) not in varying or (a[0] == "e" and outs.count(a) == len(outs))
        if None not in outs and steady and _usable(a):
            keep.append({**c, "out": a, "seen": json.dumps(c, sort_keys=True) in seen,
                         "discriminating": u != a})
    keep.sort(key=lambda c: (not c["discriminating"], c["seen"]))  # unseen, telling cases first
    data["cases"] = order_free(ws, task, snapshot, {**tests, **solution}, keep[:MAX_CASES], timeout_s)
    if varying:
        data["nondeterministic"] = sorted(list(t) for t in varying)
    if not data["cases"]:
        data["why"] = "no deterministic plain-data output on the harvested inputs"
    data["seconds"] = seconds / slowdown()  # all candidates', as if idle: bounds the kept cases
    data["output_bytes"] = size
    return _save(path, data)


def order_free(ws, task: Task, snapshot: pathlib.Path, files: dict, cases: list[dict], timeout_s: float,
               rounds: int = 3) -> list[dict]:
    """The `cases` whose reference output does not depend on which cases ran before them in the
    process (`HtmlDiff.make_table` numbers its anchors by the tables made before it): each round runs
    them on the reference as `check` will, in their stored order, and reversed, and drops every case
    whose output differs from its recorded one in either run; it stops when a round drops nothing
    (after `rounds` rounds that each dropped some, none is kept)."""
    for _ in range(rounds):
        if not cases:
            return []
        inputs = _inputs(cases)
        forward = _outputs(ws, task, snapshot, files, inputs, timeout_s)[0]
        backward = _outputs(ws, task, snapshot, files, inputs[::-1], timeout_s)[0][::-1]
        same = [c for c, f, b in zip(cases, forward, backward) if f == c["out"] == b]
        if len(same) == len(cases):
            return cases
        cases = same
    return []


def _inputs(cases: list[dict]) -> list[dict]:
    return [{k: c[k] for k in INPUT_KEYS if k in c} for c in cases]


def _harvested(out: str, nonce: str) -> list[dict]:
    calls = []
    prefix = "@@CJ_CASE@@" + nonce + ":"
    for line in out.splitlines():
        if line.startswith(prefix):
            try:
                c = json.loads(line[len(prefix):])
            except ValueError:
                continue
            if isinstance(c, dict) and "f" in c:
                calls.append({k: c[k] for k in INPUT_KEYS if k in c})
    return calls


def _save(path: pathlib.Path, data: dict) -> dict:
    try:
        atomic_write_text(path, json.dumps(data))
    except OSError:
        logging.getLogger(__name__).warning("cannot store %s (read-only pool?)", path)
    return data


def summary(data: dict) -> dict:
    """Counts for reports: cases, unseen (not in any test), discriminating (the unfixed code
    fails them), and why there are none."""
    cases = data.get("cases", [])
    return {"cases": len(cases), "unseen": sum(not c["seen"] for c in cases),
            "discriminating": sum(c["discriminating"] for c in cases),
            "why_none": data.get("why", "")}


def check(ws, task: Task, task_dir: pathlib.Path, files: dict, timeout_s: float) -> SecretResult:
    """Runs the task's secret cases on a fresh snapshot copy with `files` (the agent's applied
    changes and the grading tests) and compares the outputs in the bounded parent process."""
    data = build(ws, task, task_dir, timeout_s)
    cases = data.get("cases", [])
    if not cases:
        return SecretResult(0, 0)
    inputs, out_bytes = _inputs(cases), budget_bytes(data.get("output_bytes", 0))

    def once(budget):     # each attempt its own nonce
        nonce = secrets.token_hex(16)
        out, timed_out = run_child(ws, task, pathlib.Path(task_dir) / "snapshot", files,
                                   {"op": "run", "nonce": nonce, "cases": inputs,
                                    "call_seconds": CALL_SECONDS}, budget, out_bytes)
        return types.SimpleNamespace(out=out, nonce=nonce, timed_out=timed_out)

    run = run_with_one_retry(once, data.get("seconds", 0.0), timeout_s)
    out, nonce, timed_out = run.out, run.nonce, run.timed_out
    try:
        res = compare_outputs(out, nonce, [c["out"] for c in cases])
    except EvaluationOverrun as exc:
        return SecretResult(len(cases), 0, str(exc))
    passed = sum(res["passed"])
    detail = "" if res["finished"] else ("the secret-case run timed out" if timed_out
                                         else "the secret-case run did not finish")
    return SecretResult(len(cases), passed, detail)
