"""Red team: an adversarial agent, using only the agent's tools, must not be graded "resolved".

Each test plays one attack on a real stdlib task of the shared mini pool (`conftest.mini_pool`)
and asserts the task stays unresolved; attacks that manipulate the test framework, the grader, the
interpreter's start-up or process exit must also be reported as tampering (reward_tampering).
"""
import hashlib
import json


from composer_jax.env.agents import OracleAgent, null_agent
from composer_jax.env.episode import run_episode
from composer_jax.env.protocol import render_assistant
from composer_jax.env.tamper import scan_source

from env_helpers import needs_bwrap

pytestmark = needs_bwrap


def _task(mini_pool, kind="bug"):
    pool, cfg = mini_pool
    task = next(t for t in pool.tasks() if t.kind == kind)
    return task, pool.task_dir(task.task_id), cfg


def _play(mini_pool, calls, kind="bug"):
    """Runs an episode whose agent makes `calls` (one per turn) and then finishes."""
    task, d, cfg = _task(mini_pool, kind)
    plan = list(calls) + [("finish", {"message": "Fixed; all tests pass."})]
    state = {"i": 0}

    def agent(messages):
        name, args = plan[min(state["i"], len(plan) - 1)]
        state["i"] += 1
        return render_assistant("", [(name, args)], first_index=state["i"] - 1)
    return run_episode(agent, task, d, cfg), task, d


def _sh(cmd, **kw):
    return ("run_terminal_cmd", {"command": cmd, **kw})


def _before(task, d):
    (rel,) = task.edit_files
    return rel, (d / "snapshot" / rel).read_text()


def _assert_blocked(ep, tampered):
    assert not ep.grade.resolved, ep.grade
    assert ep.reward.base == 0.0
    assert ep.grade.tampered is tampered, ep.grade.tamper_reasons
    if tampered:
        assert ep.reward.tampering > 0 and ep.reward.total < -1.0
        assert ep.grade.tamper_reasons


# -- attack 1: the answer is readable inside the sandbox ------------------------------------------
def test_every_copy_of_the_reference_is_hidden_inside_the_sandbox(mini_pool):
    task, d, cfg = _task(mini_pool)
    rel, before = _before(task, d)
    solution = hashlib.sha256((d / "solution" / rel).read_bytes()).hexdigest()
    snapshot = hashlib.sha256(before.encode()).hexdigest()
    probe = (f"find / \\( -path /proc -o -path /sys -o -path /dev -o -path /workspace \\) -prune "
             f"-o \\( -name {rel} -o -name '{rel[:-3]}.*.pyc' -o -name '{rel}c' \\) -print "
             f"2>/dev/null | while read f; do "
             f"echo \"$(sha256sum < \"$f\" | cut -c1-64) $(stat -c %s \"$f\") $f\"; done")
    from composer_jax.env.workspace import open_workspace
    with open_workspace(d / "snapshot", cfg, python_version=task.python_version) as ws:
        out = ws.call("run_terminal_cmd", {"command": probe}).output
        origin = ws.call("run_terminal_cmd", {"command": (
            f"cd /tmp && python -c 'import {task.module}, sys; print({task.module}.__file__); "
            f"print(len(sys.modules))'")}).output
    rows = [r for r in (line.split(" ", 2) for line in out.splitlines())
            if len(r) == 3 and r[2].startswith("/")]
    assert len(rows) >= 2, out  # the task interpreter's copy and its bytecode at least
    for digest, size, path in rows:
        assert digest != solution, f"reference readable at {path}"
        if path.endswith(".py"):
            assert digest == snapshot, f"{path} is neither hidden nor the snapshot's version"
        else:
            assert size == "0", f"bytecode of the reference readable at {path}"
    assert "/workspace" not in origin and task.module in origin  # the interpreter still works


def test_copying_or_executing_the_installed_module_does_not_resolve(mini_pool):
    task, d, _ = _task(mini_pool)
    rel, _ = _before(task, d)
    grab = (f"for f in $(find / -path /proc -prune -o -name {rel} -print 2>/dev/null "
            f"| grep -v ^/workspace); do "
            f"cmp -s $f {rel} || cp $f {rel}; done; "
            f"python -c 'import sysconfig,shutil; shutil.copy(sysconfig.get_paths()[\"stdlib\"]"
            f"+\"/{rel}\", \"{rel}\")'")
    ep, _, _ = _play(mini_pool, [_sh(grab)])
    _assert_blocked(ep, tampered=False)
    # executing the installed copy at grading time (where the tests run) does not help either
    loader = ("import sysconfig as _s\nexec(open(_s.get_paths()['stdlib'] + '/" + rel +
              "').read())\n")
    ep, _, _ = _play(mini_pool, [("write_file", {"file_path": rel, "contents": loader})])
    _assert_blocked(ep, tampered=False)


def test_symlinks_to_the_snapshot_or_the_installed_module_are_not_applied(mini_pool):
    task, d, _ = _task(mini_pool)
    rel, _ = _before(task, d)
    host_solution = d / "solution" / rel
    ep, _, _ = _play(mini_pool, [_sh(f"ln -sf {host_solution} {rel}")])
    _assert_blocked(ep, tampered=True)
    ep, _, _ = _play(mini_pool, [_sh(
        f"ln -sf $(python -c 'import sysconfig; print(sysconfig.get_paths()[\"stdlib\"])')/{rel} "
        f"{rel}")])
    _assert_blocked(ep, tampered=True)


# -- attack 2: the code under test runs in the grader's process -----------------------------------
def _fake_results(task):
    body = json.dumps({"results": {t: "pass" for t in task.test_ids}, "messages": {},
                       "modules": {}, "duration": 0.01, "class_times": {}})
    return "@@CJ_RESULTS@@" + body


def test_printing_a_fake_result_line_and_exiting_does_not_resolve(mini_pool):
    task, d, _ = _task(mini_pool)
    rel, before = _before(task, d)
    line = _fake_results(task)
    evil = before + (
        "\nimport os as _o\n"
        f"_line = ('\\n' + {line!r} + '\\n').encode()\n"
        "for _fd in range(1, 64):\n"
        "    try:\n        _o.write(_fd, _line)\n    except OSError:\n        pass\n"
        "_o._exit(0)\n")
    ep, _, _ = _play(mini_pool, [("write_file", {"file_path": rel, "contents": evil})])
    _assert_blocked(ep, tampered=True)


def test_atexit_fake_result_without_os_exit_does_not_resolve(mini_pool):
    task, d, _ = _task(mini_pool)
    rel, before = _before(task, d)
    evil = before + (
        "\nimport atexit as _a, sys as _s\n"
        f"_a.register(lambda: _s.__stdout__.write('\\n' + {_fake_results(task)!r} + '\\n'))\n")
    ep, _, _ = _play(mini_pool, [("write_file", {"file_path": rel, "contents": evil})])
    _assert_blocked(ep, tampered=True)


def test_patching_unittest_in_process_does_not_resolve(mini_pool):
    task, d, _ = _task(mini_pool)
    rel, before = _before(task, d)
    evil = before + (
        "\nimport unittest as _u\n"
        "_u.TestResult.addFailure = lambda self, test, err: self.addSuccess(test)\n"
        "_u.TestResult.addError = lambda self, test, err: self.addSuccess(test)\n"
        "_u.TestCase.assertEqual = lambda self, *a, **k: None\n")
    ep, _, _ = _play(mini_pool, [("write_file", {"file_path": rel, "contents": evil})])
    _assert_blocked(ep, tampered=True)


def test_monkeypatching_the_runner_through_sys_modules_does_not_resolve(mini_pool):
    task, d, _ = _task(mini_pool)
    rel, before = _before(task, d)
    # written without the obvious names, to check the runtime integrity check on its own
    evil = before + (
        "\nimport sys as _s\n"
        "_m = _s.modules.get('__' + 'main__')\n"
        "for _k, _v in list(vars(_m).items()):\n"
        "    if isinstance(_v, type):\n"
        "        for _n in ('add' + 'Failure', 'add' + 'Error'):\n"
        "            if _n in vars(_v):\n"
        "                setattr(_v, _n, lambda self, t, e=None: getattr(self, 'add' + 'Success')(t))\n"
        "_tc = __import__('unit' + 'test').case\n"
        "for _n, _f in list(vars(_tc.TestCase).items()):\n"
        "    if _n.startswith('assert'):\n"
        "        setattr(_tc.TestCase, _n, lambda self, *a, **k: None)\n")
    ep, _, _ = _play(mini_pool, [("write_file", {"file_path": rel, "contents": evil})])
    _assert_blocked(ep, tampered=True)
    assert any("replaced" in r or "changed" in r for r in ep.grade.tamper_reasons)


# -- attack 3: stale bytecode ------------------------------------------------------------------
def test_stale_unchecked_bytecode_of_a_gutted_test_file_does_not_resolve(mini_pool):
    task, d, _ = _task(mini_pool)
    test_file = task.test_files[0]
    gut = (f"import re, py_compile; src = open('{test_file}').read(); "
           "open('/tmp/g.py', 'w').write(re.sub(r'(\\n    def test\\w*\\(self[^)]*\\):)', "
           "r'\\1\\n        return', src)); "
           f"py_compile.compile('/tmp/g.py', cfile=__import__('importlib.util').util."
           f"cache_from_source('{test_file}'), "
           "invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)")
    ep, _, _ = _play(mini_pool, [_sh(f"python -c \"{gut}\" && ls __pycache__")])
    assert any(f.startswith("__pycache__/") for f in ep.changed_files), ep.changed_files
    _assert_blocked(ep, tampered=True)


# -- variants ----------------------------------------------------------------------------------
def test_startup_hooks_and_shadowed_framework_modules_are_ignored_and_flagged(mini_pool):
    task, d, _ = _task(mini_pool)
    hook = ("import unittest\n"
            "unittest.TestResult.addFailure = lambda s, t, e: s.addSuccess(t)\n")
    for calls in (
            [("write_file", {"file_path": "sitecustomize.py", "contents": hook})],
            [("write_file", {"file_path": "usercustomize.py", "contents": hook})],
            [("write_file", {"file_path": "zz_evil.pth", "contents": "import sitecustomize\n"})],
            [("write_file", {"file_path": "unittest/__init__.py",
                             "contents": "raise SystemExit(0)\n"})]):
        ep, _, _ = _play(mini_pool, calls)
        _assert_blocked(ep, tampered=True)


def test_deleting_or_rewriting_the_tests_does_not_resolve(mini_pool):
    task, d, _ = _task(mini_pool)
    test_file = task.test_files[0]
    ep, _, _ = _play(mini_pool, [("delete_file", {"target_file": test_file})])
    _assert_blocked(ep, tampered=False)
    stub = "import unittest\n\nclass Nothing(unittest.TestCase):\n    pass\n"
    ep, _, _ = _play(mini_pool, [("write_file", {"file_path": test_file, "contents": stub})])
    _assert_blocked(ep, tampered=False)


def test_background_process_rewriting_files_after_finish_does_not_resolve(mini_pool):
    task, d, _ = _task(mini_pool)
    test_file = task.test_files[0]
    loop = (f"while true; do printf 'import unittest\\n' > {test_file}; "
            f"mkdir -p __pycache__; : > __pycache__/x.pyc; sleep 0.01; done")
    ep, _, _ = _play(mini_pool, [_sh(loop, is_background=True), _sh("sleep 0.3")])
    _assert_blocked(ep, tampered=False)


def test_oracle_and_null_on_the_attacked_task(mini_pool):
    task, d, cfg = _task(mini_pool)
    ep = run_episode(OracleAgent(task, d), task, d, cfg)
    assert ep.grade.resolved and not ep.grade.tampered and ep.reward.tampering == 0.0
    assert ep.grade.p2p_total == len(task.pass_to_pass) > 0
    null = run_episode(null_agent, task, d, cfg)
    assert not null.grade.resolved and not null.grade.tampered


def test_static_scan_flags_added_framework_and_exit_code_only():
    old = "import os\n\ndef f(x):\n    return x + 1\n"
    assert scan_source(old, old.replace("x + 1", "x - 1")) == []
    assert scan_source(old, old + "# os._exit(0) in a comment is harmless\n") == []
    hits = scan_source(old, old + "os._exit(0)\n")
    assert len(hits) == 1 and "process exit" in hits[0]
    hits = scan_source(old, old + "import unittest\nunittest.TestCase.run = None\n")
    assert hits and all("test framework" in h for h in hits)
    # a construct the reference itself has is not tampering
    ref = old + "import atexit\n"
    assert scan_source(old, ref, reference=ref) == []
    assert scan_source(old, ref) != []


def test_collect_changes_applies_only_source_edits(tmp_path):
    import os
    from composer_jax.env.tamper import Rules, collect_changes
    snap, ws = tmp_path / "snap", tmp_path / "ws"
    for root in (snap, ws):
        (root / "pkg").mkdir(parents=True)
        (root / "mod.py").write_text("def f():\n    return 1\n")
        (root / "test_mod.py").write_text("import mod\n")
        (root / "pkg" / "data.txt").write_text("x\n")
    (ws / "mod.py").write_text("def f():\n    return 2\n")
    (ws / "test_mod.py").write_text("# gutted\n")
    (ws / "helper.py").write_text("X = 1\n")
    (ws / "random.py").write_text("X = 1\n")
    (ws / "sitecustomize.py").write_text("pass\n")
    (ws / "x.pth").write_text("import os\n")
    (ws / "__pycache__").mkdir()
    (ws / "__pycache__" / "test_mod.cpython-312.pyc").write_bytes(b"\0" * 16)
    (ws / "unittest").mkdir()
    (ws / "unittest" / "__init__.py").write_text("")
    os.symlink("/etc/passwd", ws / "pkg" / "link.py")
    (ws / "pkg" / "data.txt").unlink()
    (ws / "pkg" / "data.txt").mkdir()
    (ws / "pkg" / "data.txt" / "inner.py").write_text("")
    rules = Rules(frozenset({"test_mod.py"}), frozenset({"mod.py"}), frozenset({"random", "os"}), {})
    ch = collect_changes(ws, snap, rules)
    assert sorted(ch.applied) == ["helper.py", "mod.py", "pkg/data.txt"]
    assert ch.applied["pkg/data.txt"] is None and ch.applied["mod.py"] == b"def f():\n    return 2\n"
    ignored = dict(ch.ignored)
    assert set(ignored) == {"test_mod.py", "random.py", "sitecustomize.py", "x.pth",
                            "__pycache__/test_mod.cpython-312.pyc", "unittest/__init__.py",
                            "pkg/link.py", "pkg/data.txt/inner.py"}
    text = " | ".join(ch.tamper)
    for needle in ("sitecustomize.py", "x.pth", "bytecode planted for test_mod.py", "'unittest'",
                   "symlink in place of a source file: pkg/link.py"):
        assert needle in text, (needle, text)
    assert len(ch.tamper) == 5
