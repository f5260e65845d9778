"""The secret-case process: calls a task's functions on inputs and prints their outputs as data.

Run by `composer_jax.env.secret` in a fresh sandbox over a tree (the reference's at build time, the
agent's graded tree at grading), as `python secret_child.py` with the tree as working directory.
It imports nothing from composer_jax and runs on every CPython >= 3.8; `canon` comes from
`graded_unittest.py`, staged next to it. One JSON request on stdin:
  {"op": "run", "nonce", "cases": [{"f": [module, name], "args": [canon], "kwargs": [[k, canon]],
   "init": [[canon], [[k, canon]]] (for name "Class.method": the instance's constructor
   arguments)}], "call_seconds"}  -> one line per case: MARK nonce ":" {"i", "out"} where out is
   ["r", canon(result), [canon(arg) after the call...]] or ["e", [exception class names]];
  {"op": "harvest", "nonce", "targets": [[module, name]], "tests": [ids], "max_calls"} -> runs the
   tests with the targets wrapped and prints each distinct call whose arguments are plain data.
This process runs the agent's code at grading: nothing it prints is trusted. It only ever sees
inputs; the expected outputs stay with the parent, which compares (`verdict.compare_cases`).
"""
import json
import os
import signal
import sys

MARK = "@@CJ_CASE@@"


class CallTimeout(BaseException):
    pass


def value(c):
    """The Python value of a canonical form (inputs are plain data by construction)."""
    tag = c[0]
    if tag == "N":
        return None
    if tag == "B":
        return bool(c[1])
    if tag == "i":
        return int(c[1])
    if tag == "f":
        return float(c[1])
    if tag == "c":
        return complex(c[1])
    if tag == "s":
        return c[1]
    if tag == "y":
        return bytes.fromhex(c[1])
    if tag == "Y":
        return bytearray.fromhex(c[1])
    if tag in ("l", "t"):
        items = [value(x) for x in c[1]]
        return items if tag == "l" else tuple(items)
    if tag == "d":
        return {value(k): value(v) for k, v in c[1]}
    if tag in ("S", "F"):
        items = [value(x) for x in c[1]]
        return set(items) if tag == "S" else frozenset(items)
    raise ValueError("not plain data: %r" % (tag,))


def opaque(c):
    """Whether a canonical form holds anything that is not plain data."""
    tag = c[0]
    if tag in ("o", "T", "H", "Hy", "HY"):
        return True
    if tag in ("l", "t", "S", "F"):
        return any(opaque(x) for x in c[1])
    if tag == "d":
        return any(opaque(k) or opaque(v) for k, v in c[1])
    return False


def _alarm(signum, frame):
    raise CallTimeout()


def _import(name):
    __import__(name)
    return sys.modules[name]


def _mro(exc):
    return [c.__module__ + "." + c.__qualname__ for c in type(exc).__mro__]


def _target(case):
    """The callable a case names: a module function, or a method of a freshly built instance."""
    obj = _import(case["f"][0])
    name = case["f"][1]
    if "." in name:
        cls_name, name = name.split(".", 1)
        init_args, init_kwargs = case.get("init", [[], []])
        obj = getattr(obj, cls_name)(*[value(a) for a in init_args],
                                     **{k: value(v) for k, v in init_kwargs})
    return getattr(obj, name)


def run_cases(req, canon, emit):
    signal.signal(signal.SIGALRM, _alarm)
    seconds = float(req.get("call_seconds", 2.0))
    for i, case in enumerate(req["cases"]):
        try:
            args = [value(a) for a in case["args"]]
            kwargs = {k: value(v) for k, v in case["kwargs"]}
        except Exception:
            emit({"i": i, "out": ["e", ["<bad input>"]]})
            continue
        try:
            signal.setitimer(signal.ITIMER_REAL, seconds)
            try:
                fn = _target(case)
                result = fn(*args, **kwargs)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            out = ["r", canon(result), [canon(a) for a in args]]
        except CallTimeout:
            out = ["e", ["<timeout>"]]
        except BaseException as exc:  # SystemExit and the like are outputs too
            try:
                out = ["e", _mro(exc)]
            except Exception:
                out = ["e", ["?"]]
        emit({"i": i, "out": out})


def harvest(req, canon, emit):
    import unittest
    limit = int(req.get("max_calls", 200))
    seen = set()
    inits = {}   # id(instance) -> (class, canonical constructor arguments)

    def plain_call(args, kwargs):
        c = [[canon(a) for a in args], [[k, canon(v)] for k, v in sorted(kwargs.items())]]
        if any(opaque(x) for x in c[0]) or any(opaque(v) for _, v in c[1]):
            return None
        return c

    def record(key, args, kwargs, init=None):
        if len(seen) >= limit:
            return
        try:
            c = plain_call(args, kwargs)
            if c is None:
                return
            case = {"f": list(key), "args": c[0], "kwargs": c[1]}
            if init is not None:
                case["init"] = init
            s = json.dumps(case, sort_keys=True)
            if s not in seen and len(s) <= 4096:
                seen.add(s)
                emit(case)
        except Exception:
            pass

    def wrap_function(key, fn):
        def wrapper(*args, **kwargs):
            record(key, args, kwargs)
            return fn(*args, **kwargs)
        return _like(wrapper, fn)

    def wrap_method(key, cls, fn):
        def wrapper(self, *args, **kwargs):
            got = inits.get(id(self))
            if got is not None and got[0] is type(self) is cls:
                record(key, args, kwargs, got[1])
            return fn(self, *args, **kwargs)
        return _like(wrapper, fn)

    def wrap_init(cls):
        orig = cls.__init__

        def __init__(self, *args, **kwargs):
            if type(self) is cls:
                try:
                    c = plain_call(args, kwargs)
                    if c is not None:
                        inits[id(self)] = (cls, c)
                except Exception:
                    pass
            return orig(self, *args, **kwargs)
        return _like(__init__, orig)

    wrapped = set()
    for mod, name in [tuple(t) for t in req["targets"]]:
        try:
            m = _import(mod)
            if "." not in name:
                setattr(m, name, wrap_function((mod, name), getattr(m, name)))
                continue
            cls_name, meth = name.split(".", 1)
            cls = getattr(m, cls_name)
            if cls not in wrapped:
                wrapped.add(cls)
                cls.__init__ = wrap_init(cls)
            setattr(cls, meth, wrap_method((mod, name), cls, cls.__dict__[meth]))
        except Exception:
            continue
    suite = unittest.TestSuite()
    for tid in req["tests"]:
        try:
            suite.addTest(unittest.defaultTestLoader.loadTestsFromName(tid))
        except Exception:
            continue
    with open(os.devnull, "w") as null:
        unittest.TextTestRunner(stream=null).run(suite)


def _like(wrapper, fn):
    """`wrapper` with `fn`'s name, qualname, doc and module (what tests may inspect)."""
    wrapper.__wrapped__ = fn
    for a in ("__name__", "__qualname__", "__doc__", "__module__"):
        try:
            setattr(wrapper, a, getattr(fn, a))
        except Exception:
            pass
    return wrapper


def main():
    req = json.loads(sys.stdin.readline())
    fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
    here = sys.path[0]
    sys.path.insert(0, here)
    from graded_unittest import canon, make_dump
    del sys.path[0]
    sys.path[0] = os.getcwd()  # the tree, as `python -m ...` run there would see it
    for name in list(sys.modules):  # the task's modules come from the tree
        if any(name == t or name.startswith(t + ".") for t in req.get("fresh", ())):
            del sys.modules[name]
    dump = make_dump(json.encoder.encode_basestring_ascii)
    write = sys.stdout.write
    flush = sys.stdout.flush
    prefix = MARK + req["nonce"] + ":"
    pid = os.getpid()

    def emit(body):
        if os.getpid() != pid:  # a process a case forked (pty.spawn) came back here: not the case's output
            os._exit(0)
        write(prefix + dump(body) + "\n")
        flush()
    if req["op"] == "run":
        run_cases(req, canon, emit)
    else:
        harvest(req, canon, emit)
    emit({"done": True})
    flush()
    os._exit(0)


if __name__ == "__main__":
    main()
