"""Runs unittest ids inside the sandbox and prints one JSON line of per-test outcomes.

Usage: python -I -S -B unittest_runner.py [--module NAME]... TEST_NAME...   (nonce on stdin)
       python -I -S -B unittest_runner.py --serve      (fork server; see `serve`)
  TEST_NAME: a module ("test_foo"), class ("test_foo.Cls") or test id ("test_foo.Cls.test_x").
  --module NAME: also report where module NAME was imported from (to check the workspace copy
  shadows the installed one).

The current directory goes first on sys.path, and modules it provides that the interpreter or
unittest had already imported (e.g. difflib, textwrap) are forgotten so the tests import the
workspace copy. Test output is sent to /dev/null; the last stdout
line is "@@CJ_RESULTS@@<nonce>:" followed by JSON: {"results": {id: "pass"|"fail"|"error"|"skip"},
"messages": {id: short reason}, "modules": {name: file}, "duration": seconds, "class_times":
{test class id: seconds spent in its tests}, "integrity": [what the code under test replaced]}.
Runs on every CPython >= 3.8 (it is executed by each task's own interpreter).

Integrity (the code under test runs in this process, so it is not trusted):
  * the nonce comes on stdin (one-shot) or in the request (serve) and is read before any workspace
    code is imported; the host accepts only the result line that carries it, so a line printed by
    the code under test is ignored (and reported as a forgery);
  * before importing workspace code the runner records the identity of everything the outcome
    depends on (unittest's classes and module functions, this runner's result class, json, os,
    builtins, sys.meta_path/path_hooks, the trace and profile hooks), and after loading the tests
    the test classes' own functions; after the run any replacement is listed in "integrity" and
    the host counts the run as tampered (nothing passes).
"""
import json
import os
import sys
import time
import unittest

MARKER = "@@CJ_RESULTS@@"
# Modules never re-imported from the workspace (the interpreter and this runner depend on them).
KEEP = frozenset(sys.builtin_module_names) | frozenset({
    "os", "sys", "io", "abc", "codecs", "encodings", "site", "stat", "posixpath", "genericpath",
    "_collections_abc", "types", "warnings", "json", "time", "unittest", "test"})


def unshadow_workspace_modules(directory):
    """Forgets already-imported modules that the workspace provides, so tests import its copy."""
    for name in os.listdir(directory):
        mod = name[:-3] if name.endswith(".py") else None
        if mod and mod in sys.modules and mod not in KEEP:
            del sys.modules[mod]


class _Result(unittest.TestResult):
    def __init__(self):
        super().__init__()
        self.outcomes = {}
        self.messages = {}
        self.class_times = {}
        self._started = 0.0

    def startTest(self, test):
        super().startTest(test)
        self._started = time.time()

    def stopTest(self, test):
        super().stopTest(test)
        cls = test.id().rsplit(".", 1)[0]
        self.class_times[cls] = self.class_times.get(cls, 0.0) + time.time() - self._started

    def _set(self, test, status, err=None):
        tid = test.id()
        if self.outcomes.get(tid) in ("fail", "error") and status == "pass":
            return
        self.outcomes[tid] = status
        if err is not None and tid not in self.messages:
            exc = err[1]
            self.messages[tid] = ("%s: %s" % (type(exc).__name__, exc))[:300]

    def addSuccess(self, test):
        self._set(test, "pass")

    def addFailure(self, test, err):
        self._set(test, "fail", err)

    def addError(self, test, err):
        self._set(test, "error", err)

    def addSkip(self, test, reason):
        self.outcomes[test.id()] = "skip"

    def addExpectedFailure(self, test, err):
        self._set(test, "pass")

    def addUnexpectedSuccess(self, test):
        self._set(test, "fail")

    def addSubTest(self, test, subtest, err):
        if err is not None:
            failed = issubclass(err[0], test.failureException)
            self._set(test, "fail" if failed else "error", err)


def _parse(argv):
    modules, names = [], []
    it = iter(argv)
    for a in it:
        if a == "--module":
            modules.append(next(it))
        else:
            names.append(a)
    return names, modules


def _prepare():
    """Imports the stdlib test helpers before the workspace can shadow the `test` package."""
    try:
        import test.support  # noqa: F401
    except ImportError:
        pass


def _ident(value):
    """What must not change about a watched attribute: the object and, for functions, its code."""
    inner = getattr(value, "__func__", value)
    return (id(value), id(getattr(inner, "__code__", None)), id(getattr(inner, "__defaults__", None)))


def _watch_namespace(prefix, namespace, out, callables_only=False, keys=False, _ident=_ident):
    """Records `namespace`'s entries (only the callable ones if `callables_only`); with `keys`
    also its set of names (an added override such as `run` then shows too)."""
    for key, value in list(namespace.items()):
        if callables_only and not (callable(value) or hasattr(value, "__func__")):
            continue
        out[prefix + key] = _ident(value)
    if keys:
        out[prefix + "<keys>"] = tuple(sorted(namespace))


def integrity_snapshot(_watch_namespace=_watch_namespace):
    """Identities of everything the reported outcomes depend on (see the module docstring)."""
    import builtins
    import json.encoder
    import unittest.case
    import unittest.loader
    import unittest.result
    import unittest.suite
    out = {}
    classes = [unittest.case.TestCase, unittest.result.TestResult, unittest.suite.BaseTestSuite,
               unittest.suite.TestSuite, unittest.loader.TestLoader, _Result,
               json.encoder.JSONEncoder]
    if hasattr(unittest.case, "_Outcome"):
        classes.append(unittest.case._Outcome)
    for cls in classes:
        _watch_namespace("%s.%s." % (cls.__module__, cls.__qualname__), dict(vars(cls)), out,
                         keys=True)
    main_module = sys.modules.get("__main__")
    for mod in (unittest, unittest.case, unittest.result, unittest.suite, unittest.loader, json,
                json.encoder, os, sys, main_module):
        _watch_namespace(mod.__name__ + ".", dict(vars(mod)), out, callables_only=True)
    bvars = {k: v for k, v in vars(builtins).items() if k != "_"}
    _watch_namespace("builtins.", bvars, out)
    out["sys.meta_path"] = tuple(id(x) for x in sys.meta_path)
    out["sys.path_hooks"] = tuple(id(x) for x in sys.path_hooks)
    out["sys.gettrace()"] = id(sys.gettrace())
    out["sys.getprofile()"] = id(sys.getprofile())
    out["sys.modules[__main__]"] = id(sys.modules.get("__main__"))
    return out


def test_classes(suite, into):
    """Adds the (non-unittest) classes of the test cases in `suite` to the list `into`."""
    stack = [suite]
    while stack:
        item = stack.pop()
        if isinstance(item, unittest.TestSuite):
            stack.extend(item)
            continue
        for cls in type(item).__mro__:
            if cls not in into and not cls.__module__.startswith("unittest") and cls is not object:
                into.append(cls)


def classes_snapshot(classes, _watch_namespace=_watch_namespace):
    """Identities of the functions of the loaded test classes (defined by the restored tests)."""
    out = {}
    for cls in classes:
        funcs = {k: v for k, v in vars(cls).items() if callable(v) or hasattr(v, "__func__")}
        _watch_namespace("%s.%s." % (cls.__module__, cls.__qualname__), funcs, out)
    return out


def compare(before, after):
    """Names recorded before whose identity changed (or that disappeared)."""
    bad = []
    for key in sorted(before):
        if before.get(key) != after.get(key):
            bad.append(key + (" changed" if key.endswith(">") or key.endswith(")")
                              else " replaced"))
    return bad


def run_names(names, modules, _snapshot=integrity_snapshot, _compare=compare,
              _classes_snapshot=classes_snapshot, _dumps=json.dumps, _result_class=_Result,
              _loader=unittest.defaultTestLoader, _time=time.time):
    """Runs the tests (in this process) and returns the JSON result line (everything it uses after
    the workspace is imported is bound as a default, so rebinding module names does not reach
    this call)."""
    watched = _snapshot()
    classes, tests_watched = [], {}
    sys.path.insert(0, os.getcwd())
    unshadow_workspace_modules(os.getcwd())
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    start = _time()
    result = _result_class()
    found = {}
    for name in names:
        try:
            suite = _loader.loadTestsFromName(name)
        except BaseException as exc:  # the name does not resolve: that test errors
            result.outcomes[name] = "error"
            result.messages[name] = ("%s: %s" % (type(exc).__name__, exc))[:300]
            continue
        try:
            new = []
            test_classes(suite, new)
            new = [c for c in new if c not in classes]
            classes.extend(new)
            tests_watched.update(_classes_snapshot(new))
        except BaseException:
            pass
        try:
            suite.run(result)
        except BaseException as exc:
            result.outcomes.setdefault(name, "error")
            result.messages.setdefault(name, ("%s: %s" % (type(exc).__name__, exc))[:300])
        for key in [k for k in result.outcomes if k.startswith("unittest.loader._FailedTest.")]:
            result.outcomes.pop(key)  # the loader could not import/find `name`: it errors
            result.outcomes[name] = "error"
            msg = result.messages.pop(key, "")
            result.messages.setdefault(name, msg)
    for name in names:
        if name.count(".") >= 2 and name not in result.outcomes:
            result.outcomes[name] = "error"  # e.g. a loader _FailedTest under another id
    for m in modules:
        mod = sys.modules.get(m)
        if mod is not None:
            found[m] = getattr(mod, "__file__", None)
        else:  # imported fresh and dropped again (test.support.import_fresh_module)
            import importlib.util
            spec = importlib.util.find_spec(m)
            found[m] = spec.origin if spec else None
    times = {k: round(v, 4) for k, v in result.class_times.items()}
    integrity = _compare(watched, _snapshot())
    try:
        integrity += _compare(tests_watched, _classes_snapshot(classes))
    except BaseException as exc:
        integrity.append("test classes could not be re-inspected: %s" % type(exc).__name__)
    return _dumps({"results": result.outcomes, "messages": result.messages, "modules": found,
                   "duration": _time() - start, "class_times": times,
                   "integrity": integrity[:50]})



def _emit(fd, nonce, body, _write=os.write, _marker=MARKER):
    data = ("\n" + _marker + nonce + ":" + body + "\n").encode()
    while data:
        data = data[_write(fd, data):]


def main(argv, _emit=_emit, _exit=os._exit):
    """One-shot mode: read the nonce from stdin, run the tests named on the command line, print
    the result line, exit."""
    nonce = sys.stdin.readline().strip()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    names, modules = _parse(argv)
    _prepare()
    fd = os.dup(1)
    line = run_names(names, modules)
    _emit(fd, nonce, line)
    _exit(0)


def serve():
    """Fork-server mode: a warm interpreter (unittest and test.support imported) reads one JSON
    request per stdin line ({"names": [...], "modules": [...]}) and runs each in a forked child,
    so every run starts from the same clean state; the result line goes to stdout."""
    _prepare()
    out = os.dup(1)
    for line in sys.stdin:
        req = json.loads(line)
        nonce = str(req.get("nonce", ""))
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                os.close(0)
                data = run_names(req["names"], req.get("modules", [])).encode()
                while data:
                    data = data[os.write(w, data):]
            finally:
                os._exit(0)
        os.close(w)
        chunks = []
        while True:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(r)
        os.waitpid(pid, 0)
        body = b"".join(chunks).decode() or json.dumps({"error": "the test process died"})
        _emit(out, nonce, body)


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
    else:
        main(sys.argv[1:])
