"""The graded test process: `python -m unittest ID...`, run by the grader in a fresh sandbox.

The grader binds this file over the task interpreter's `unittest/__main__.py` (bubblewrap), so the
graded process has the argv, flags, environment, paths and working directory of the agent's own
`python -m unittest ID...` (on the fallback backend it runs as a script). It runs on every
CPython >= 3.8 and imports nothing from composer_jax.

This process runs the agent's code, so NOTHING it reports is trusted by itself. What it does:
  1. Reads one JSON line from stdin ({"nonce", "modules": test module names, "edited": module names
     of the edited files}), then puts /dev/null on fd 0 (as the agent's shell does).
  2. Compiles the task's test modules (trusted: restored from the snapshot) through its own import
     hook, with every assertion instrumented (`instrument`): `self.assertX(a, b, ...)` records the
     method name and *canonical values* of its arguments before the call, `assert e` records e,
     `assertRaises` (call and `with` forms) records the expected exception and what the code under
     test actually raised. Canonical values (`canon`) are built from exact builtin types only, by
     code that never calls a method of an object the agent's code could define; anything else is
     recorded as opaque (only its type name).
  3. Runs the named tests with unittest's text runner (output as `python -m unittest` gives) and,
     after each test, writes one line `@@CJ_OBS@@<nonce>:{"id", "status", "obs", "truncated"}`.
The parent (`composer_jax.env.verdict`) re-evaluates every recorded assertion itself and demands
that each assertion site the trusted reference run verified was reached and passed; the child's
"status" only ever lowers a verdict (see the README's threat model).
"""
import os
import sys

MARK = "@@CJ_OBS@@"
MAX_OBS = 4000          # observations kept per test (more: "truncated")
MAX_NODES = 4000        # nodes of one canonical value (more: opaque)
MAX_STR = 4096          # longer strings/bytes are recorded by length and digest (equality only)
TEST_NODES = 200000     # canonical nodes per test (beyond: opaque)
TEST_CHARS = 1 << 20    # characters of strings/bytes kept per test (beyond: by digest)
ASSERTS = frozenset("""assertEqual assertEquals assertNotEqual assertNotEquals assertTrue
assertFalse assertIs assertIsNot assertIsNone assertIsNotNone assertIn assertNotIn assertLess
assertLessEqual assertGreater assertGreaterEqual assertAlmostEqual assertAlmostEquals
assertNotAlmostEqual assertCountEqual assertListEqual assertTupleEqual assertDictEqual
assertSetEqual assertSequenceEqual assertMultiLineEqual assertIsInstance assertNotIsInstance
assertRegex assertNotRegex assertRegexpMatches failUnless failIf failUnlessEqual assert_
failIfEqual""".split())
RAISES = frozenset({"assertRaises", "assertRaisesRegex", "assertRaisesRegexp", "failUnlessRaises"})
# Modules never re-imported from the workspace (the interpreter itself depends on them).
KEEP = frozenset({"os", "sys", "io", "abc", "codecs", "encodings", "site", "stat", "posixpath",
                  "genericpath", "_collections_abc", "types", "builtins", "unittest"})


def _name_of(cls):
    """"module.qualname" of a class, read without calling anything the class may override."""
    try:
        d = type.__dict__
        mod = d["__module__"].__get__(cls)
        qual = d["__qualname__"].__get__(cls)
    except Exception:
        return "?"
    return "%s.%s" % (mod if type(mod) is str else "?", qual if type(qual) is str else "?")


def _mro_names(cls):
    try:
        return [_name_of(c) for c in type.__dict__["__mro__"].__get__(cls)]
    except Exception:
        return []


def canon(x, _budget=None):
    """A JSON-able tagged form of `x` built from exact builtin types only (see module doc).
    `_budget` = [nodes left, characters left] (shared by the nested calls)."""
    budget = [MAX_NODES, TEST_CHARS] if _budget is None else _budget
    budget[0] -= 1
    if budget[0] < 0:
        return ["o", "<too large>"]
    t = type(x)
    if x is None:
        return ["N"]
    if t is bool:
        return ["B", x]
    if t is int:
        if int.bit_length(x) > 4000:
            return ["o", "int"]
        return ["i", int.__repr__(x)]
    if t is float:
        return ["f", float.__repr__(x)]
    if t is complex:
        return ["c", complex.__repr__(x)]
    if t is str:
        n = str.__len__(x)
        if n > MAX_STR or n > budget[1]:
            return ["H", _digest(str.encode(x, "utf-8", "surrogatepass")), n]
        budget[1] -= n
        return ["s", x]
    if t is bytes or t is bytearray:
        b = bytes(x) if t is bytearray else x
        tag = "y" if t is bytes else "Y"
        n = bytes.__len__(b)
        if n > MAX_STR or 2 * n > budget[1]:
            return ["H" + tag, _digest(b), n]
        budget[1] -= 2 * n
        return [tag, bytes.hex(b)]
    if t is list or t is tuple:
        return ["l" if t is list else "t", [canon(e, budget) for e in (list.__iter__(x) if t is list
                                                                      else tuple.__iter__(x))]]
    if t is dict:
        return ["d", [[canon(k, budget), canon(v, budget)] for k, v in dict.items(x)]]
    if t is set or t is frozenset:
        return ["S" if t is set else "F", [canon(e, budget) for e in
                                           (set.__iter__(x) if t is set else frozenset.__iter__(x))]]
    if t is type:
        return ["T", _name_of(x)]
    base = _plain_base(t)
    if base is not None:  # e.g. a namedtuple: its items, as the base type compares them
        return canon(_AS_BASE[base](x), budget)
    return ["o", _name_of(t)]


# How to read a builtin-subclass instance as its exact base type, without calling its methods.
_AS_BASE = {tuple: lambda x: tuple(tuple.__iter__(x)), list: lambda x: list(list.__iter__(x)),
            str: lambda x: str.__getitem__(x, slice(None)), int: int.__int__,
            float: float.__float__, bytes: lambda x: bytes.__getitem__(x, slice(None)),
            dict: lambda x: dict(dict.items(x)), set: lambda x: set(set.__iter__(x)),
            frozenset: lambda x: frozenset(frozenset.__iter__(x))}


def _plain_base(t):
    """The builtin base of class `t` when no class between them defines __eq__/__ne__ (then `==`
    on its instances is the base type's), else None."""
    try:
        mro = type.__dict__["__mro__"].__get__(t)
        get_dict = type.__dict__["__dict__"].__get__
        for i, c in enumerate(mro):
            if any(c is b for b in _AS_BASE):
                for k in mro[:i]:
                    d = get_dict(k)
                    if "__eq__" in d or "__ne__" in d:
                        return None
                return c
    except Exception:
        return None
    return None


_SHA256 = []  # bound by `main` before any workspace code runs


def _sha256_function():
    """SHA-256 from the interpreter's own C module (cheaper to import than hashlib)."""
    for name in ("_sha2", "_sha256"):
        try:
            return __import__(name).sha256
        except (ImportError, AttributeError):
            continue
    import hashlib
    return hashlib.sha256


def _digest(b):
    if not _SHA256:
        _SHA256.append(_sha256_function())
    return _SHA256[0](b).hexdigest()


def make_dump(encode_str):
    """A JSON writer for the records (dict/list/str/int/bool/None), built from builtins and
    `encode_str` (the C string encoder, bound before workspace code runs) - so patching the json
    module cannot rewrite what is sent."""
    def dump(x):
        t = type(x)
        if x is None:
            return "null"
        if t is bool:
            return "true" if x else "false"
        if t is int:
            return int.__repr__(x)
        if t is str:
            return encode_str(x)
        if t is list or t is tuple:
            return "[" + ",".join([dump(e) for e in x]) + "]"
        if t is dict:
            return "{" + ",".join([encode_str(str(k)) + ":" + dump(v)
                                   for k, v in dict.items(x)]) + "}"
        return "null"
    return dump


class Recorder:
    """Collects the current test's observations (the instrumented tests call it)."""

    def __init__(self):
        self.current = None
        self.obs = []
        self.truncated = False
        self.left = [TEST_NODES, TEST_CHARS]

    def reset(self, test_id):
        self.current, self.obs, self.truncated = test_id, [], False
        self.left = [TEST_NODES, TEST_CHARS]

    def _canon(self, value):
        """`canon` within what is left of this test's budgets."""
        budget = [min(MAX_NODES, self.left[0]), self.left[1]]
        start = budget[0]
        out = canon(value, budget)
        self.left = [self.left[0] - (start - budget[0]), budget[1]]
        return out

    def _add(self, item):
        if self.current is None:
            return
        if len(self.obs) >= MAX_OBS:
            self.truncated = True
            return
        self.obs.append(item)

    def a(self, site, name, fn, *args, **kw):
        """An assertion call: records canonical arguments, then calls the method."""
        try:
            if name in ("assertIsInstance", "assertNotIsInstance") and len(args) >= 2:
                cls = args[1]
                want = [_name_of(c) for c in (cls if type(cls) is tuple else (cls,))]
                self._add(["i", site, name, _mro_names(type(args[0])), want])
            else:
                extra = {k: self._canon(kw[k]) for k in ("places", "delta") if k in kw}
                self._add(["a", site, name, [self._canon(v) for v in args[:3]], extra])
        except Exception:
            self._add(["a", site, name, [["o", "?"]], {}])
        return fn(*args, **kw)

    def t(self, site, value):
        """An `assert` statement's condition."""
        try:
            self._add(["t", site, self._canon(value)])
        except Exception:
            self._add(["t", site, ["o", "?"]])
        return value

    def exp(self, site, exc):
        """The exception an assertRaises expects (a class or a tuple of classes)."""
        self._add(["e", site, [_name_of(c) for c in (exc if type(exc) is tuple else (exc,))]])
        return exc

    def raised(self, site, exc):
        """What the guarded code raised (None: it returned normally)."""
        self._add(["r", site, None if exc is None else _mro_names(type(exc))])

    def call(self, site, fn):
        """Wraps the callable of `assertRaises(E, fn, ...)` to record what it raises."""
        rec = self

        def guarded(*args, **kw):
            try:
                out = fn(*args, **kw)
            except BaseException as e:
                rec.raised(site, e)
                raise
            rec.raised(site, None)
            return out
        return guarded


def instrument(tree, rec_name, prefix=""):
    """Rewrites a test module's AST in place (see module doc); original line numbers are kept.
    Sites are numbered in source order, as "<prefix>:<n>" (unique across modules)."""
    import ast

    counter = [0]

    def site():
        counter[0] += 1
        return ast.Constant("%s:%d" % (prefix, counter[0]))

    def rec(attr):
        return ast.Attribute(ast.Name(rec_name, ast.Load()), attr, ast.Load())

    class T(ast.NodeTransformer):
        def visit_Call(self, node):
            self.generic_visit(node)
            f = node.func
            if not isinstance(f, ast.Attribute) or any(isinstance(a, ast.Starred) for a in node.args):
                return node
            if f.attr in ASSERTS:
                new = ast.Call(rec("a"), [site(), ast.Constant(f.attr), f] + node.args,
                               node.keywords)
                return ast.copy_location(new, node)
            if f.attr in RAISES and len(node.args) >= 1:
                s = site()
                node.args[0] = ast.copy_location(ast.Call(rec("exp"), [s, node.args[0]], []),
                                                 node.args[0])
                k = 2 if f.attr != "assertRaises" and f.attr != "failUnlessRaises" else 1
                if len(node.args) > k:
                    node.args[k] = ast.copy_location(
                        ast.Call(rec("call"), [ast.Constant(s.value), node.args[k]], []),
                        node.args[k])
            return node

        def visit_Assert(self, node):
            self.generic_visit(node)
            node.test = ast.copy_location(ast.Call(rec("t"), [site(), node.test], []), node.test)
            return node

        def _with(self, node):
            self.generic_visit(node)
            if len(node.items) != 1:
                return node
            call = node.items[0].context_expr
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and call.func.attr in RAISES and len(call.args) >= 1
                    and isinstance(call.args[0], ast.Call)):
                return node
            s = call.args[0].args[0].value  # the site visit_Call gave the expected exception
            name = "_cj_e%d" % counter[0]
            handler = ast.ExceptHandler(
                ast.Name("BaseException", ast.Load()), name,
                [ast.Expr(ast.Call(rec("raised"), [ast.Constant(s), ast.Name(name, ast.Load())],
                                   [])), ast.Raise()])
            orelse = [ast.Expr(ast.Call(rec("raised"), [ast.Constant(s), ast.Constant(None)], []))]
            guard = ast.Try(node.body, [handler], orelse, [])
            node.body = [ast.copy_location(guard, node.body[0])]
            return node

        visit_With = _with
        visit_AsyncWith = _with

    T().visit(tree)
    ast.fix_missing_locations(tree)
    return tree


def _install_hook(modules, rec, rec_name):
    """An import hook compiling the named test modules, and the interpreter's own `test` package
    helpers they use (e.g. test.audiotests; trusted, read-only), with `instrument`."""
    import ast
    import importlib.machinery
    stdlib_test = os.path.join(os.path.dirname(os.__file__), "test") + os.sep

    class Loader(importlib.machinery.SourceFileLoader):
        def get_code(self, fullname):
            source = self.get_data(self.path)
            try:
                tree = instrument(ast.parse(source, self.path), rec_name, fullname)
            except (SyntaxError, RecursionError, ValueError, MemoryError):
                return super().get_code(fullname)
            return compile(tree, self.path, "exec", dont_inherit=True)

        def exec_module(self, module):
            module.__dict__[rec_name] = rec
            importlib.machinery.SourceFileLoader.exec_module(self, module)

    class Finder:
        @classmethod
        def find_spec(cls, fullname, path=None, target=None):
            helper = fullname.startswith("test.") and fullname != "test.support" and \
                not fullname.startswith("test.support.")
            if fullname not in modules and not helper:
                return None
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is None or not str(spec.origin or "").endswith(".py"):
                return spec
            if helper and not str(spec.origin).startswith(stdlib_test):
                return None
            spec.loader = Loader(fullname, spec.origin)
            spec.cached = None
            return spec

    sys.meta_path.insert(0, Finder)


def _rebind(stale):
    """Edited modules the interpreter imported before this process was set up came from their
    installed copies (the snapshot's, bound by the grader): each is imported again from the
    working directory, and every loaded module holding the old one as a global gets the new one,
    so the interpreter's own machinery (traceback formatting through textwrap and linecache, which
    unittest's loader uses on every dotted test id) runs the code being graded, as it does in the
    agent's own `python -m unittest` run. A module that fails to import is left to fail the tests
    that import it."""
    import importlib
    for name, old in stale.items():
        try:
            new = importlib.import_module(name)
        except BaseException:
            continue
        for module in list(sys.modules.values()):
            d = getattr(module, "__dict__", None)
            if type(d) is dict and module is not new:
                for key in [k for k, v in list(d.items()) if v is old]:
                    d[key] = new


def main():
    import json
    import json.encoder
    _SHA256.append(_sha256_function())
    encode_str = getattr(json.encoder, "c_encode_basestring_ascii", None) or \
        json.encoder.encode_basestring_ascii
    dumps = make_dump(encode_str)
    write = os.write
    line = sys.stdin.readline()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    req = json.loads(line)
    nonce = str(req["nonce"])
    names = sys.argv[1:]
    if sys.argv[0].endswith("__main__.py"):  # what unittest/__main__.py itself does
        sys.argv[0] = os.path.basename(sys.executable) + " -m unittest"
    import unittest

    out = os.dup(1)
    rec = Recorder()
    rec_name = "_cj%s" % os.urandom(4).hex()
    _install_hook(frozenset(req.get("modules", ())), rec, rec_name)
    # Tests that draw their data (at module level, then per test) draw the same data in the
    # reference runs and in the graded run, so a site the reference verified is not lost to a
    # larger draw that leaves its values over a size budget (opaque).
    import random
    reseed = random.seed  # bound now: agent code cannot take it away
    reseed("test modules")
    cwd = os.getcwd()
    if sys.path[:1] != [cwd]:
        sys.path.insert(0, cwd)
    stale = {}
    for m in req.get("edited", ()):  # imported before the tests: forget, so they get the workspace's
        if m in sys.modules and m.split(".")[0] not in KEEP:
            stale[m] = sys.modules.pop(m)
    _rebind(stale)
    marker = MARK + nonce + ":"

    def emit(body):
        data = str.encode("\n" + marker + body + "\n")
        while data:
            data = data[write(out, data):]

    base = unittest.TextTestResult

    class Result(base):
        def startTest(self, test):
            rec.reset(test.id())
            reseed(test.id())
            self._cj_status = "pass"
            base.startTest(self, test)

        def _mark(self, status):
            order = {"pass": 0, "skip": 1, "fail": 2, "error": 3}
            if order[status] > order.get(getattr(self, "_cj_status", "pass"), 0):
                self._cj_status = status

        def addFailure(self, test, err):
            self._mark("fail")
            base.addFailure(self, test, err)

        def addError(self, test, err):
            self._mark("error")
            base.addError(self, test, err)

        def addSkip(self, test, reason):
            self._mark("skip")
            base.addSkip(self, test, reason)

        def addUnexpectedSuccess(self, test):
            self._mark("fail")
            base.addUnexpectedSuccess(self, test)

        def addSubTest(self, test, subtest, err):
            if err is not None:
                self._mark("fail" if issubclass(err[0], test.failureException) else "error")
            base.addSubTest(self, test, subtest, err)

        def stopTest(self, test):
            base.stopTest(self, test)
            emit(dumps({"id": test.id(), "status": self._cj_status, "obs": rec.obs,
                        "truncated": rec.truncated}))
            rec.current, rec.obs = None, []

    loader = unittest.defaultTestLoader
    suite = unittest.TestSuite()
    for name in names:
        try:
            suite.addTest(loader.loadTestsFromName(name))
        except Exception as exc:  # an unknown id: it gets no record, so the parent fails it
            sys.stderr.write("cannot load %s: %s\n" % (name, type(exc).__name__))
    runner = unittest.TextTestRunner(stream=sys.stderr, resultclass=Result)
    runner.run(suite)
    emit(dumps({"done": True}))
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
