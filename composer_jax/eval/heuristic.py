"""The scripted heuristic baseline: mutation-based program repair through the agent's tools.

It never sees the reference: it lists the workspace, runs the test modules, and localises suspects
-- the lines of the non-test modules that tracebacks point at, then the lines ranked by
spectrum-based fault localisation (Ochiai: per-test line coverage of failing vs passing tests,
collected by a small tracing script it runs in the sandbox) -- and tries single-token edits there -- the inverses of common slips: comparison flips (< <=, == !=, in / not in, is / is not),
arithmetic swaps (+ -, * /), and/or, True/False, an integer literal +-1, adding or removing a `not`.
An edit that lowers the number of failing tests is kept, one that does not is reverted; it
finishes when the tests pass or its budget of test runs is spent, and it says honestly whether the
tests pass. It resolves simple single-bug tasks and never a feature, refactoring or migration task
that needs new code: a baseline between the null agent and the oracle.
"""
from __future__ import annotations

import re

from composer_jax.env.protocol import render_assistant

MAX_TEST_RUNS = 24
MAX_LINES = 4
MAX_SUSPECTS = 10
MAX_MUTANTS_PER_LINE = 8

_SWAPS = [(r"<=", "<"), (r"(?<![<>=!])<(?![<=])", "<="), (r">=", ">"), (r"(?<![<>=!-])>(?![>=])", ">="),
          (r"==", "!="), (r"!=", "=="), (r"\bnot in\b", "in"), (r"(?<!not )\bin\b", "not in"),
          (r"\bis not\b", "is"), (r"\bis\b(?! not)", "is not"), (r"\band\b", "or"), (r"\bor\b", "and"),
          (r"\bTrue\b", "False"), (r"\bFalse\b", "True"), (r"(?<=\s)\+(?=\s)", "-"),
          (r"(?<=\s)-(?=\s)", "+"), (r"(?<=\s)\*(?=\s)", "/"), (r"(?<=\s)/(?=\s)", "*"),
          (r"(?<=\s)//(?=\s)", "/")]
_INT = re.compile(r"(?<![\w.])\d+(?![\w.])")
_COND = re.compile(r"^(\s*(?:if|elif|while)\s+)(.*):\s*$")


def line_mutants(line: str) -> list[str]:
    """Candidate single-token edits of one source line (deduplicated, in a fixed order)."""
    code, hash_, comment = line.partition("#")
    out, negate = [], []
    m = _COND.match(code)
    if m:   # dropping a `not` is tried first, adding one (a coarse change) last
        cond = m.group(2).strip()
        nm = re.match(r"^not\s*\((.*)\)$", cond) or re.match(r"^not\s+(\w[\w.]*)$", cond)
        if nm:
            out.append(f"{m.group(1)}{nm.group(1)}:")
        else:
            negate.append(f"{m.group(1)}not ({cond}):")
    for pattern, repl in _SWAPS:
        for hit in re.finditer(pattern, code):
            out.append(code[:hit.start()] + repl + code[hit.end():])
    for hit in _INT.finditer(code):
        n = int(hit.group())
        for v in (n + 1, n - 1):
            if v >= 0:
                out.append(code[:hit.start()] + str(v) + code[hit.end():])
    seen, result = set(), []
    for c in out + negate:
        c = c.rstrip() + ("  " + hash_ + comment if hash_ else "")
        if c != line and c not in seen:
            seen.add(c)
            result.append(c)
    return result[:MAX_MUTANTS_PER_LINE]


def count_failures(output: str) -> int | None:
    """Failing + erroring tests from unittest's summary line; None when there is no summary."""
    m = re.search(r"FAILED \(([^)]*)\)", output)
    if m:
        return sum(int(v) for k, v in re.findall(r"(failures|errors)=(\d+)", m.group(1)))
    if re.search(r"^\s*(\d+\s+)?OK\b", output, re.MULTILINE):   # `uniq -c` may prefix a count
        return 0
    return None


_MUTABLE = re.compile(r"[<>=!]=|[<>]|\b(and|or|not|in|is|True|False)\b|\s[-+*/]\s|\d")


def traceback_lines(output: str, modules: list[str]) -> list[tuple[str, int]]:
    """(module file, line) pairs named by traceback frames, most frequent first."""
    counts: dict[tuple[str, int], int] = {}
    for m in re.finditer(r'^\s*(\d+)\s+File "(?:[^"]*/)?([^"/]+\.py)", line (\d+)', output, re.MULTILINE):
        if m.group(2) in modules:
            key = (m.group(2), int(m.group(3)))
            counts[key] = counts.get(key, 0) + int(m.group(1))
    return sorted(counts, key=lambda k: (-counts[k], k))


class HeuristicAgent:
    """An agent callable (`messages -> assistant text`) running the repair script above."""

    def __init__(self):
        self._gen = self._script()
        self._pending = None
        self._index = 0

    def __call__(self, messages: list[dict]) -> str:
        last = messages[-1]["content"] if messages and messages[-1]["role"] == "tool" else ""
        try:
            name, args = self._gen.send(last) if self._pending else next(self._gen)
        except StopIteration:
            name, args = "finish", {"message": "Stopping."}
        self._pending = True
        text = render_assistant("", [(name, args)], first_index=self._index)
        self._index += 1
        return text

    def _script(self):
        listing = yield ("list_dir", {"relative_workspace_path": "."})
        names = re.findall(r"^([\w.]+\.py) \(", listing, re.MULTILINE)
        tests = [n for n in names if n.startswith("test_")]
        modules = [n for n in names if n not in tests]
        if not tests or not modules:
            yield ("finish", {"message": "I could not find tests to run, so I changed nothing."})
            return
        files = "|".join(re.escape(m) for m in modules + tests)
        cmd = (f"python -m unittest {' '.join(t[:-3] for t in tests)} 2>&1 | "
               f"grep -E '^  File \".*({files})\", line|^(FAILED|OK)' | sort | uniq -c | sort -rn | head -n 80")
        out = yield ("run_terminal_cmd", {"command": cmd})
        fails, runs = count_failures(out), 1
        tried: set[tuple[str, int, str]] = set()
        while fails and runs < MAX_TEST_RUNS:
            sites = yield from self._suspects(out, modules, tests)
            improved = False
            for path, line, text, ctx, center in sites:
                for mutant in line_mutants(text):
                    if runs >= MAX_TEST_RUNS:
                        break
                    if (path, line, mutant) in tried:
                        continue
                    tried.add((path, line, mutant))
                    old = "\n".join(ctx)
                    new = "\n".join(ctx[:center] + [mutant] + ctx[center + 1:])
                    r = yield ("search_replace", {"file_path": path, "old_string": old, "new_string": new})
                    if r.startswith("Error"):
                        continue
                    new_out = yield ("run_terminal_cmd", {"command": cmd})
                    runs += 1
                    n = count_failures(new_out)
                    if n is not None and n < fails:
                        fails, out, improved = n, new_out, True
                        break
                    yield ("search_replace", {"file_path": path, "old_string": new, "new_string": old})
                if improved or runs >= MAX_TEST_RUNS:
                    break
            if not improved:
                break
        if fails == 0:
            yield ("finish", {"message": "Fixed: the test suite passes now."})
        else:
            yield ("finish", {"message": f"I could not fix it: {fails if fails is not None else 'some'} "
                                         f"tests still fail."})

    def _suspects(self, out: str, modules: list[str], tests: list[str]):
        """Suspicious (file, line, text, context lines, index of the line in them): the module
        lines that tracebacks name, then the module lines ranked by spectrum-based fault
        localisation (Ochiai over per-test line coverage, run in the sandbox), keeping lines with
        something a slip could flip."""
        sites, seen = [], set()
        ranked = list(traceback_lines(out, modules)[:MAX_LINES])
        sbfl = yield ("run_terminal_cmd", {"command": sbfl_command(modules, tests)})
        ranked += [(f, n) for f, n in sbfl_lines(sbfl) if (f, n) not in ranked]
        for path, line in ranked[:MAX_SUSPECTS]:
            window = yield ("read_file", {"target_file": path, "start_line": max(1, line - 1),
                                          "end_line": line + 1})
            got = _numbered(window)
            if line in got and (path, line) not in seen and _MUTABLE.search(got[line].split("#")[0]):
                seen.add((path, line))
                nums = [i for i in (line - 1, line, line + 1) if i in got]
                sites.append((path, line, got[line], [got[i] for i in nums], nums.index(line)))
        return sites


_SBFL = r"""
import collections, math, os, sys, unittest
MODS = set(%(mods)r)
def flat(s):
    for t in s:
        yield from (flat(t) if isinstance(t, unittest.TestSuite) else [t])
cur = set()
def tracer(frame, event, arg):
    if os.path.basename(frame.f_code.co_filename) in MODS:
        if event == "line":
            cur.add((os.path.basename(frame.f_code.co_filename), frame.f_lineno))
        return tracer
    return None
cov, failed = collections.defaultdict(set), set()
for i, t in enumerate(flat(unittest.defaultTestLoader.loadTestsFromNames(%(tests)r))):
    cur = set()
    r = unittest.TestResult()
    sys.settrace(tracer)
    try:
        t.run(r)
    finally:
        sys.settrace(None)
    if not r.wasSuccessful():
        failed.add(i)
    for k in cur:
        cov[k].add(i)
F = max(1, len(failed))
score = {k: len(v & failed) / math.sqrt(F * len(v)) for k, v in cov.items() if v & failed}
for (f, n), s in sorted(score.items(), key=lambda kv: (-kv[1], kv[0]))[:%(top)d]:
    print(f"SBFL {f}:{n} {s:.3f}")
"""


def sbfl_command(modules: list[str], tests: list[str], top: int = 30) -> str:
    """A shell command printing `SBFL file:line score` for the most suspicious module lines."""
    script = _SBFL % {"mods": sorted(modules), "tests": [t[:-3] for t in tests], "top": top}
    return f"python - 2>/dev/null <<'CJ_SBFL_EOF' | grep '^SBFL'\n{script}\nCJ_SBFL_EOF"


def sbfl_lines(output: str) -> list[tuple[str, int]]:
    """(file, line) pairs of an `sbfl_command` output, most suspicious first."""
    return [(f, int(n)) for f, n in re.findall(r"^SBFL (\S+?):(\d+) ", output, re.MULTILINE)]


def _numbered(window: str) -> dict[int, str]:
    """{line number: text} from a read_file result."""
    return {int(n): t for n, t in re.findall(r"^\s*(\d+)\t(.*)$", window, re.MULTILINE)}
