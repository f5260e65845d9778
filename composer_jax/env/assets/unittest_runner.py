"""Runs unittest ids inside the sandbox and prints one JSON line of per-test outcomes.

Usage: python -S unittest_runner.py [--module NAME]... TEST_NAME...
       python -S unittest_runner.py --serve      (fork server; see `serve`)
  TEST_NAME: a module ("test_foo"), class ("test_foo.Cls") or test id ("test_foo.Cls.test_x").
  --module NAME: also report where module NAME was imported from (to check the workspace copy
  shadows the installed one).

The current directory goes first on sys.path, and modules it provides that the interpreter or
unittest had already imported (e.g. difflib, textwrap) are forgotten so the tests import the
workspace copy. Test output is sent to /dev/null; the last stdout
line is "@@CJ_RESULTS@@" followed by JSON: {"results": {id: "pass"|"fail"|"error"|"skip"},
"messages": {id: short reason}, "modules": {name: file}, "duration": seconds, "class_times":
{test class id: seconds spent in its tests}}.
Runs on every CPython >= 3.8 (it is executed by each task's own interpreter).
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


def run_names(names, modules):
    """Runs the tests (in this process) and returns the JSON result line."""
    sys.path.insert(0, os.getcwd())
    unshadow_workspace_modules(os.getcwd())
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    start = time.time()
    result = _Result()
    found = {}
    for name in names:
        try:
            suite = unittest.defaultTestLoader.loadTestsFromName(name)
        except BaseException as exc:  # the name does not resolve: that test errors
            result.outcomes[name] = "error"
            result.messages[name] = ("%s: %s" % (type(exc).__name__, exc))[:300]
            continue
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
    return json.dumps({"results": result.outcomes, "messages": result.messages, "modules": found,
                       "duration": time.time() - start, "class_times": times})


def main(argv):
    """One-shot mode: run the tests named on the command line, print the result line, exit."""
    names, modules = _parse(argv)
    _prepare()
    out = os.fdopen(os.dup(1), "w")
    line = run_names(names, modules)
    out.write("\n" + MARKER + line + "\n")
    out.flush()
    os._exit(0)


def serve():
    """Fork-server mode: a warm interpreter (unittest and test.support imported) reads one JSON
    request per stdin line ({"names": [...], "modules": [...]}) and runs each in a forked child,
    so every run starts from the same clean state; the result line goes to stdout."""
    _prepare()
    out = os.fdopen(os.dup(1), "w")
    for line in sys.stdin:
        req = json.loads(line)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
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
        out.write("\n" + MARKER + body + "\n")
        out.flush()


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
    else:
        main(sys.argv[1:])
