"""Red team, issue 39: attacks that beat a grader trusting the graded process, each with several
variants, played with the agent's tools only on a real task with secret cases and held-back tests
(`conftest.case_pool`: stdlib `fnmatch`). Each payload is appended to the *broken* module, so a
"resolved" grade would be a pass without a fix.

The classes: (1) forging the record, the Result or the emit closure from inside the graded
process (gc, frames, `__main__`, audit hooks, `sys.settrace`), including an empty record claiming
a pass with `truncated` set; (2) code that fixes the bug only while it believes it is being
tested ('unittest' in sys.modules, argv sniffing, a test file on the stack); (3) parent work the
child controls (an exponential regex, huge or deep records) - grading must stay within 3x an
honest grading of the same task. What stops (1) and (2) is what the graded process never sees: the
secret cases (inputs recorded at build time, outputs compared in the parent) - so each test also
asserts that those cases, not a recognised trick, refused the pass.

Later attempts (the acceptance on a clean clone): (4) code wrong only on inputs no test uses (a
lookup of the tests' inputs, held-back ones included); (5) steering the secret-case process itself
(emptying its request, ending it early); (6) a fix kept outside the repository (start-up hooks in
the user site and on an exported PYTHONPATH, live in the agent's own test runs); (7) grader memory
and disk: thousands of new modules (capped: `tamper.MAX_APPLIED_BYTES`, `MAX_NEW_MODULES`), and
new modules named like another platform's standard library (`winreg.py`: imported where the
standard library tries it).
"""
import base64
import json
import os

import pytest

from composer_jax.env import tamper
from composer_jax.env.secret_child import value
from env_helpers import needs_bwrap
from redteam_helpers import case_task, play_task

pytestmark = needs_bwrap

# -- payloads (appended to the broken module) -----------------------------------------------------
# A generic forger: rewrites what the recorder sees so every assertion holds with the test's own
# expected value (actual := expected, assertTrue(x) := assertTrue(True)). It defeats any grading
# computed from the graded process's observations, held-back tests included.
_REWRITE = '''
def _rw(a):
    if getattr(a, "_rw", 0):
        return a
    def a2(site, name, fn, *args, **kw):
        if name in ("assertTrue", "assert_", "failUnless") and args:
            args = (True,) + args[1:]
        elif name in ("assertFalse", "failIf") and args:
            args = (False,) + args[1:]
        elif "Equal" in name and "Not" not in name and len(args) > 1:
            args = (args[1], args[1]) + args[2:]
        return a(site, name, fn, *args, **kw)
    a2._rw = 1
    return a2
'''
FORGERS = {
    "gc": _REWRITE + '''
_gc = __import__("g" + "c")
for _o in getattr(_gc, "get_" + "objects")():
    if type(_o).__name__ == "Rec" + "order":
        _o.a = _rw(_o.a)
''',
    "frames": '''
import sys as _s
def _emit_forged():
    f = getattr(_s, "_get" + "frame")(0)
    while f is not None:
        loc = f.f_locals
        if "emit" in loc and "dumps" in loc:
            for tid in IDS:
                loc["emit"](loc["dumps"]({"id": tid, "status": "pass", "obs": [],
                                          "truncated": True}))
            loc["emit"](loc["dumps"]({"done": True}))
            getattr(__import__("o" + "s"), "_ex" + "it")(0)
        f = f.f_back
_orig_filter = filter
def filter(names, pat):
    _emit_forged()
    return _orig_filter(names, pat)
_orig_fnmatch = fnmatch
def fnmatch(name, pat):
    _emit_forged()
    return _orig_fnmatch(name, pat)
''',
    "main_module": _REWRITE + '''
import sys as _s
_m = _s.modules.get("__main__")
_R = getattr(_m, "Rec" + "order", None)
if _R is not None:
    _R.a = (lambda orig: (lambda self, *a, **k: _rw(orig.__get__(self))(*a, **k)))(_R.a)
''',
    "audit_hook": _REWRITE + '''
import sys as _s
_gc = __import__("g" + "c")
def _hook(event, args):
    if event == "import" or event == "exec":
        for _o in getattr(_gc, "get_" + "objects")():
            if type(_o).__name__ == "Rec" + "order" and not getattr(_o.a, "_rw", 0):
                _o.a = _rw(_o.a)
getattr(_s, "add" + "audithook")(_hook)
''',
    "settrace": _REWRITE + '''
import sys as _s
def _tr(frame, event, arg):
    for v in list(frame.f_globals.values()):
        if type(v).__name__ == "Rec" + "order" and not getattr(v.a, "_rw", 0):
            v.a = _rw(v.a)
    return None
getattr(_s, "set" + "trace")(_tr)
import threading as _t
_t.settrace(_tr)
''',
}

# Fixes the bug only while the code believes it is under test: the reference's functions are
# defined next to the broken ones and chosen per call by CONDITION.
SPECIAL = {
    "unittest_imported": "'unit' + 'test' in __import__('sys').modules",
    "argv_sniffing": "any('unit' + 'test' in a or 'test_' in a for a in "
                     "__import__('sys').argv + list(getattr(__import__('sys'), 'orig_argv', [])))",
    "test_file_on_stack": "any('test_' in f.filename for f in __import__('inspect').stack(0))",
    "test_module_loaded": "any(n.startswith('test_') or n == 'test' for n in "
                          "list(__import__('sys').modules))",
}
_DISPATCH = '''
_good = {}
exec(compile(GOOD, __file__, "exec"), _good)
def _pick(name, bad):
    def f(*a, **k):
        return (_good[name] if (CONDITION) else bad)(*a, **k)
    f.__name__ = name
    return f
for _n in ("fnmatch", "fnmatchcase", "filter", "translate"):
    if _n in globals():
        globals()[_n] = _pick(_n, globals()[_n])
'''


def _graded(case_pool, payload, kind="bug"):
    task, d, cfg = case_task(case_pool, kind)
    rel = task.edit_files[0]
    broken = (d / "snapshot" / rel).read_text()
    ep = play_task(task, d, cfg, [("write_file", {"file_path": rel, "contents": broken + payload})])
    return task, ep


def _refused_by_secret_cases(ep):
    """Not resolved, and - when the graded run finished (a slow forger may instead run out of
    its time budget) - the secret cases are what refused it."""
    g = ep.grade
    assert not g.resolved, (g.results, g.reasons)
    assert ep.reward.base == 0.0
    if g.ok:
        assert g.secret_total > 0 and g.secret_passed < g.secret_total, (g.secret_passed, g.detail)
    else:
        assert "timed out" in g.detail, g.detail


@pytest.mark.parametrize("how", sorted(FORGERS))
def test_forging_what_the_graded_process_reports_does_not_resolve(case_pool, how):
    task, _, _ = case_task(case_pool)
    payload = FORGERS[how].replace("IDS", repr(list(task.test_ids)))
    _, ep = _graded(case_pool, payload)
    _refused_by_secret_cases(ep)


@pytest.mark.parametrize("kind", ["bug", "feature"])
def test_the_generic_forger_passes_the_tests_but_not_the_secret_cases(case_pool, kind):
    """The strongest forger makes the graded tests (held-back ones included) pass: only inputs
    the graded process never sees refuse it."""
    _, ep = _graded(case_pool, FORGERS["gc"], kind)
    _refused_by_secret_cases(ep)


def test_an_empty_record_with_truncated_set_passes_no_test(case_pool):
    task, _, _ = case_task(case_pool)
    _, ep = _graded(case_pool, FORGERS["frames"].replace("IDS", repr(list(task.test_ids))))
    g = ep.grade
    assert g.f2p_passed == 0 and g.p2p_passed == 0, g.results
    assert all("not reached" in r for r in g.reasons.values()), g.reasons


@pytest.mark.parametrize("condition", sorted(SPECIAL))
def test_fixing_only_under_test_does_not_resolve(case_pool, condition):
    task, d, _ = case_task(case_pool)
    good = (d / "solution" / task.edit_files[0]).read_text()
    payload = _DISPATCH.replace("GOOD", repr(good)).replace("CONDITION", SPECIAL[condition])
    _, ep = _graded(case_pool, payload)
    _refused_by_secret_cases(ep)
    if ep.grade.ok:  # it passes the graded tests: the tests alone could not refuse it
        assert ep.grade.f2p_passed == ep.grade.f2p_total, ep.grade.reasons


def test_held_back_tests_are_nowhere_in_the_agents_sandbox(case_pool):
    task, d, cfg = case_task(case_pool)
    method = task.held_back[0].rsplit(".", 1)[1]
    assert method not in task.problem_statement
    find = ("grep -rla --include=test_fnmatch.py {} '{}' / 2>/dev/null | grep -v ^/proc "
            "| sort | tr '\\n' ' '")
    probe = (f"{find.format('', 'def test_')}; echo '|'; "  # sources and bytecode
             f"{find.format(chr(39) + '--include=test_fnmatch.*.pyc' + chr(39), method)}")
    from composer_jax.env.workspace import open_workspace
    with open_workspace(d / "snapshot", cfg, python_version=task.python_version) as ws:
        out = ws.call("run_terminal_cmd", {"command": probe, "timeout": 60}).output
    copies, _, holding = out.split("[exit code")[0].partition("|")
    assert len(copies.split()) >= 2, out  # the workspace's and the installed copies were read
    assert holding.strip() == "", out
    assert not (d / "snapshot" / "secret_cases.json").exists()


# -- parent work the child controls -------------------------------------------------------------
# BODY: a Python expression (with `tid` and `_j` = json) giving the record line the forger emits.
_PARENT_WORK = {
    "exponential_regex": '_j.dumps({"id": tid, "status": "pass", "obs": [["a", "test_fnmatch:1", '
                         '"assertRegex", [["s", "a" * 3000 + "!"], ["s", "(a+)+$"]], {}]] * 20})',
    "quadratic_count": '_j.dumps({"id": tid, "status": "pass", "obs": [["a", "test_fnmatch:1", '
                       '"assertCountEqual", [["l", [["l", [["i", str(i)]]] for i in '
                       'range(20000)]], ["l", [["l", [["i", str(-i)]]] for i in range(20000)]]], '
                       '{}]]})',
    "deep_nesting": '\'{"id": "%s", "status": "pass", "obs": [\' % tid + "[" * 300000',
    "output_flood": '_j.dumps({"id": tid, "status": "pass", "obs": [["t", "x", ["s", "y" * '
                    '(1 << 20)]]]})',
}
_EMIT_OBS = '''
import sys as _s
import json as _j
def _emit_forged():
    f = getattr(_s, "_get" + "frame")(0)
    while f is not None:
        loc = f.f_locals
        if "emit" in loc and "dumps" in loc:
            for tid in IDS:
                loc["emit"](BODY)
            loc["emit"]('{"done": true}')
            getattr(__import__("o" + "s"), "_ex" + "it")(0)
        f = f.f_back
_orig_fnmatch = fnmatch
def fnmatch(name, pat):
    _emit_forged()
    return _orig_fnmatch(name, pat)
_orig_filter = filter
def filter(names, pat):
    _emit_forged()
    return _orig_filter(names, pat)
'''


@pytest.fixture(scope="module")
def honest_seconds(case_pool):
    task, d, cfg = case_task(case_pool)
    rel = task.edit_files[0]
    fixed = (d / "solution" / rel).read_text()
    times = []
    for _ in range(2):
        ep = play_task(task, d, cfg, [("write_file", {"file_path": rel, "contents": fixed})])
        assert ep.grade.resolved, ep.grade.reasons
        times.append(ep.grade.seconds)
    return min(times)


@pytest.mark.parametrize("what", sorted(_PARENT_WORK))
def test_parent_work_the_child_controls_stays_within_3x_an_honest_grading(case_pool, what,
                                                                          honest_seconds,
                                                                          monkeypatch):
    from composer_jax.env import graded_run
    monkeypatch.setattr(graded_run, "runnable_now", lambda: 1)    # not overloaded: no retry
    task, _, _ = case_task(case_pool)
    payload = _EMIT_OBS.replace("BODY", _PARENT_WORK[what]).replace(
        "IDS", repr(list(task.test_ids)))
    _, ep = _graded(case_pool, payload)
    assert not ep.grade.resolved
    assert ep.grade.seconds <= 3 * honest_seconds + 0.5, (ep.grade.seconds, honest_seconds,
                                                         ep.grade.detail)


def test_an_endless_loop_fails_within_3x_an_honest_grading(case_pool, honest_seconds,
                                                           monkeypatch):
    """On a machine that is not overloaded (pinned here: the other CI worker may overload this
    one, and then an overrun is retried once, `run_with_one_retry`)."""
    from composer_jax.env import graded_run
    monkeypatch.setattr(graded_run, "runnable_now", lambda: 1)
    _, ep = _graded(case_pool, "\n_f0 = fnmatch\ndef fnmatch(n, p):\n    while True:\n"
                               "        pass\n")
    assert not ep.grade.resolved
    assert ep.grade.seconds <= 3 * honest_seconds + 0.5, (ep.grade.seconds, honest_seconds)


@pytest.mark.skipif(os.geteuid() != 0, reason="a graded run has its own uid only when run as root")
def test_graded_code_cannot_buy_a_retry_with_its_own_load(case_pool, monkeypatch):
    """The retry on an overloaded machine (`run_with_one_retry`) asks how many threads are
    runnable only after the overrun's sandbox is gone, so graded code that starts busy processes
    and then never finishes is not counted: the reading the grader acts on holds none of its
    spinners, and the edit stays unresolved."""
    from composer_jax.env import graded_run
    real, seen = graded_run.runnable_now, []
    monkeypatch.setattr(graded_run, "runnable_now", lambda: seen.append(real()) or seen[-1])
    spinners = 16
    _, ep = _graded(case_pool, "\n_o = __import__('o' + 's')\n"
                               f"for _i in range({spinners}):\n"
                               "    if _o.fork() == 0:\n        while True:\n            pass\n"
                               "_f0 = fnmatch\ndef fnmatch(n, p):\n    while True:\n"
                               "        pass\n")
    assert not ep.grade.resolved
    assert seen, "the overrun was not judged"
    assert max(seen) < spinners, (seen, ep.grade.detail)


# -- later attempts ------------------------------------------------------------------------------
def _secret_inputs(d) -> set:
    """repr((args, sorted kwargs)) of the task's unseen secret cases the unfixed code fails."""
    cases = json.loads((d / "secret_cases.json").read_text())["cases"]
    return {repr((tuple(value(a) for a in c["args"]),
                  tuple(sorted((k, value(v)) for k, v in c["kwargs"]))))
            for c in cases if c["discriminating"] and not c["seen"]}


def test_code_wrong_only_on_inputs_no_test_uses_passes_every_test_but_not_the_secret_cases(
        case_pool):
    """The fix everywhere except on the secret inputs (an attacker that memorised every input any
    test uses, held-back tests included, and left the bug elsewhere): every graded test passes;
    only outputs on inputs no test shows refuse it."""
    task, d, _ = case_task(case_pool)
    secret = _secret_inputs(d)
    assert secret
    good = (d / "solution" / task.edit_files[0]).read_text()
    cond = f"repr((a, tuple(sorted(k.items())))) not in {secret!r}"
    _, ep = _graded(case_pool, _DISPATCH.replace("GOOD", repr(good)).replace("CONDITION", cond))
    g = ep.grade
    _refused_by_secret_cases(ep)
    assert g.ok and g.f2p_passed == g.f2p_total and g.p2p_passed == g.p2p_total, g.reasons


# Fixed only under unittest (so the graded tests pass), and at import finds the secret-case
# process's request (a dict with "cases" and "nonce") up the stack.
_STEER = _DISPATCH.replace("CONDITION", SPECIAL["unittest_imported"]) + '''
import sys as _s2, os as _o2
def _steer():
    f = _s2._getframe(0)
    while f is not None:
        req = f.f_locals.get("req")
        if isinstance(req, dict) and "cases" in req and "nonce" in req:
            ACTION
        f = f.f_back
_steer()
'''
STEERING = {
    "empty_the_request": 'del req["cases"][:]\n            return',
    "print_done_and_exit": ('em = f.f_locals.get("emit")\n            if em is not None:\n'
                            '                em({"done": True})\n                _o2._exit(0)'),
}


@pytest.mark.parametrize("how", sorted(STEERING))
def test_steering_the_secret_case_process_does_not_resolve(case_pool, how):
    """Code fixed only under unittest passes the graded tests; the secret-case process is then
    emptied or ended early: a case without an output is a failed case, never a skipped one."""
    task, d, _ = case_task(case_pool)
    good = (d / "solution" / task.edit_files[0]).read_text()
    _, ep = _graded(case_pool, _STEER.replace("GOOD", repr(good)).replace("ACTION", STEERING[how]))
    g = ep.grade
    _refused_by_secret_cases(ep)
    assert g.f2p_passed == g.f2p_total, g.reasons


# Serves the reference's text for the task's module from a start-up hook (a meta-path finder, so
# it survives sys.modules being cleared).
_OUTSIDE_HOOK = '''
import sys as _s, importlib.abc as _a, importlib.util as _u
class _Serve(_a.MetaPathFinder, _a.Loader):
    def find_spec(self, name, path=None, target=None):
        return _u.spec_from_loader(name, self) if name == MOD else None
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        exec(compile(GOOD, "<fixed>", "exec"), module.__dict__)
_s.modules.pop(MOD, None)
if not any(type(f).__name__ == "_Serve" for f in _s.meta_path):
    _s.meta_path.insert(0, _Serve())
'''


def test_a_fix_kept_outside_the_repository_is_not_graded(case_pool):
    """The fix as start-up hooks outside the workspace (usercustomize and a .pth in the user site,
    sitecustomize on a PYTHONPATH exported in the shell and ~/.bashrc): the agent's own test run
    passes, the grading (a fresh sandbox, only the diff of the workspace) does not see them."""
    task, d, cfg = case_task(case_pool)
    rel = task.edit_files[0]
    hook = _OUTSIDE_HOOK.replace("GOOD", repr((d / "solution" / rel).read_text())).replace(
        "MOD", repr(rel[:-3]))
    put = (f"U=$(python -c 'import site; print(site.getusersitepackages())') && "
           f"mkdir -p $U /tmp/hooks && echo {base64.b64encode(hook.encode()).decode()} | "
           f"base64 -d > $U/usercustomize.py && cp $U/usercustomize.py /tmp/hooks/sitecustomize.py "
           f"&& echo 'import usercustomize' > $U/zz.pth && echo 'export PYTHONPATH=/tmp/hooks' "
           f">> ~/.bashrc && export PYTHONPATH=/tmp/hooks && "
           f"python -m unittest {task.test_files[0][:-3]} 2>&1 | tail -1")
    ep = play_task(task, d, cfg, [("run_terminal_cmd", {"command": put})])
    own_run = next(m["content"] for m in ep.messages if m.get("role") == "tool")
    assert own_run.startswith("OK"), own_run  # the hooks fix the code in the agent's sandbox
    g = ep.grade
    assert not g.resolved and g.f2p_passed < g.f2p_total and not g.tampered, g.results


_PAD = ("python -c \"import sys; [open('pad_%d.py' % i, 'w').write('# ' + 'z' * int(sys.argv[2]) "
        "+ chr(10)) for i in range(int(sys.argv[1]))]\" {n} {size}")


@pytest.mark.parametrize("n,size", [(6, 1900000), (tamper.MAX_NEW_MODULES + 4, 10)])
def test_many_new_modules_fail_the_episode_within_budget_without_penalty(case_pool, n, size,
                                                                        honest_seconds):
    """A correct fix plus 11 MiB of new modules, or more new modules than the cap: the grader
    refuses before reading them (it used to hold them all and copy them into two fresh trees:
    150 such modules took 18x an honest grading and ~270 MiB of the grader's memory)."""
    task, d, cfg = case_task(case_pool)
    rel = task.edit_files[0]
    fixed = (d / "solution" / rel).read_text()
    ep = play_task(task, d, cfg, [("write_file", {"file_path": rel, "contents": fixed}),
                                  ("run_terminal_cmd", {"command": _PAD.format(n=n, size=size)})])
    g = ep.grade
    assert not g.resolved and not g.ok and "budget" in g.detail, g.detail
    assert not g.tampered and ep.reward.tampering == 0.0
    assert g.seconds <= 3 * honest_seconds + 0.5, (g.seconds, honest_seconds)


@pytest.mark.parametrize("name", ["winreg.py", "msvcrt.py", "_winapi.py", "nt.py"])
def test_new_modules_named_like_another_platforms_stdlib_are_not_applied(name):
    rules = tamper.Rules(frozenset({"test_m.py"}), frozenset({"m.py"}),
                         tamper.stdlib_module_names("/nonexistent"))
    assert "shadow" in tamper.new_module_allowed(name, rules, frozenset({"m.py", "test_m.py"}))
    assert tamper.new_module_allowed("m_helpers.py", rules, frozenset({"m.py"})) == ""


# -- honest code under a burst of load -------------------------------------------------------------
def test_a_retried_run_budget_follows_the_threads_runnable_now(monkeypatch):
    """The 1-minute load lags a burst by tens of seconds; a retry's budget also scales with the
    threads runnable at this instant."""
    from composer_jax.env import graded_run as gr
    monkeypatch.setattr(gr.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(gr, "slowdown", lambda: 1.0)
    monkeypatch.setattr(gr, "runnable_now", lambda: 1)
    assert gr.budget_slowdown() == 1.0
    assert gr.budget_s(0.05, 60.0) == pytest.approx(gr.GRACE_S + gr.FACTOR * 0.05)
    monkeypatch.setattr(gr, "runnable_now", lambda: 20)
    assert gr.budget_slowdown() == 10.0
    assert gr.budget_s(0.05, 60.0, gr.budget_slowdown()) == pytest.approx(
        gr.GRACE_S + gr.FACTOR * 0.05 * 10)
    assert gr.budget_s(5.0, 6.0, 10.0) == 6.0                       # never above the cap
    monkeypatch.undo()
    assert gr.runnable_now() >= 1                                   # this thread, at least


def test_an_overrun_is_retried_once_with_twice_the_budget_only_on_an_overloaded_machine(
        monkeypatch):
    """Overloaded: more threads runnable just after the overrun (the grader's own among them,
    standing in for the finished run) than CPUs."""
    import types
    from composer_jax.env import graded_run as gr
    monkeypatch.setattr(gr.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(gr, "slowdown", lambda: 1.0)
    budgets = []

    def endless(budget):
        budgets.append(budget)
        return types.SimpleNamespace(timed_out=True)

    one = gr.GRACE_S + gr.FACTOR * 0.05
    monkeypatch.setattr(gr, "runnable_now", lambda: 2)            # a CPU each: not overloaded
    assert gr.run_with_one_retry(endless, 0.05, 60.0).timed_out and budgets == [pytest.approx(one)]
    budgets.clear()
    monkeypatch.setattr(gr, "runnable_now", lambda: 3)            # one more: overloaded
    assert gr.run_with_one_retry(endless, 0.05, 60.0).timed_out
    assert budgets == [pytest.approx(one), pytest.approx(2 * (gr.GRACE_S + gr.FACTOR * 0.05 * 1.5))]
    budgets.clear()
    monkeypatch.setattr(gr, "runnable_now", lambda: 8)            # 4 per CPU: overloaded
    assert gr.run_with_one_retry(endless, 0.05, 60.0).timed_out
    assert budgets == [pytest.approx(one), pytest.approx(2 * (gr.GRACE_S + gr.FACTOR * 0.05 * 4))]
    budgets.clear()
    assert gr.run_with_one_retry(endless, 5.0, 6.0).timed_out and budgets == [6.0, 6.0]  # the cap
    budgets.clear()
    fits = lambda b: budgets.append(b) or types.SimpleNamespace(timed_out=False)  # noqa: E731
    assert not gr.run_with_one_retry(fits, 0.05, 60.0).timed_out and len(budgets) == 1


@pytest.mark.slow
def test_honest_fixes_graded_together_during_a_burst_all_resolve(case_pool):
    """16 episodes of one task graded at once beside 4 CPU-bound processes (a rollout group of an
    RL job next to training threads): each reference fix resolves. With the budget scaled by the
    1-minute load alone and no retry, 2-3 of 16 test runs timed out here (slow: it loads the
    machine for seconds, which would disturb the timing checks running beside it in CI)."""
    import subprocess
    import sys
    import threading
    task, d, cfg = case_task(case_pool)
    rel = task.edit_files[0]
    fixed = (d / "solution" / rel).read_text()
    grades = []

    def one():
        ep = play_task(task, d, cfg, [("write_file", {"file_path": rel, "contents": fixed})])
        grades.append(ep.grade)

    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(4)]
    try:
        threads = [threading.Thread(target=one) for _ in range(16)]
        [t.start() for t in threads]
        [t.join() for t in threads]
    finally:
        for b in burners:
            b.kill()
    failed = [(g.ok, g.detail[-120:]) for g in grades if not g.resolved]
    assert len(grades) == 16 and not failed, failed
