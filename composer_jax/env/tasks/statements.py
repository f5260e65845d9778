"""Terse problem statements, like a real request to a coding assistant.

`module_file` is the edited file's workspace path ("bisect.py", "simplejson/decoder.py"),
`test_file` how the tests are named ("test_bisect.py", "simplejson/tests/")."""
from __future__ import annotations


def _tests(ids, limit: int = 3) -> str:
    shown = ", ".join(f"`{t}`" for t in ids[:limit])
    return shown + (f" and {len(ids) - limit} more" if len(ids) > limit else "")


def _symptom(messages: dict, ids) -> str:
    for t in ids:
        msg = (messages.get(t) or "").strip().splitlines()
        if msg:
            text = msg[0][:160].rstrip()
            return f" First failure: {text}{'' if text.endswith(('.', '!', '?')) else '.'}"
    return ""


def bug_statement(module_file: str, test_file: str, f2p, messages: dict) -> str:
    return (f"Tests in {test_file} are failing: {_tests(f2p)}.{_symptom(messages, f2p)} "
            f"Something in {module_file} is broken; please find the bug and fix it without changing "
            f"the tests.")


def multi_bug_statement(module_file: str, test_file: str, f2p, messages: dict) -> str:
    return (f"Several tests in {test_file} fail ({_tests(f2p)}).{_symptom(messages, f2p)} "
            f"There may be more than one bug in {module_file}. Fix them; don't touch the tests.")


def feature_statement(module_file: str, qualname: str, doc: str, test_file: str) -> str:
    first = (doc or "").strip().splitlines()
    hint = f' Its docstring says: "{first[0][:160]}"' if first else ""
    return (f"`{qualname}` in {module_file} is not implemented (it raises NotImplementedError).{hint} "
            f"Implement it so that the tests in {test_file} pass.")


def migration_statement(module_file: str, old: str, new: str, test_file: str, f2p) -> str:
    return (f"{module_file} here is the Python {old} version, but {test_file} comes from Python {new} "
            f"and fails: {_tests(f2p)}. Update {module_file} so the new tests pass (run them with "
            f"`python -m unittest {test_file[:-3]}`).")


def refactor_statement(module_file: str, kind: str, old: str, new: str, test_file: str) -> str:
    what = {"class": "class", "function": "function", "method": "method"}[kind]
    return (f"Refactor: rename the {what} `{old}` in {module_file} to `{new}` and update every use "
            f"of it in {module_file}. Behaviour must not change. {test_file} already uses the new "
            f"name (and checks that the old one is gone); don't keep an alias and don't edit the "
            f"tests.")


def large_feature_statement(module_file: str, label: str, stubs, test_file: str) -> str:
    hints = []
    for qual, doc in stubs:
        first = (doc or "").strip().splitlines()
        if first:
            hints.append(f"`{qual}`: {first[0][:100].rstrip('.')}")
    hint = (" Docstrings: " + "; ".join(hints[:6]) + ".") if hints else ""
    return (f"The implementation of {label} in {module_file} is missing: every body raises "
            f"NotImplementedError (signatures and docstrings are still there).{hint} Implement "
            f"them so that the tests in {test_file} pass.")
