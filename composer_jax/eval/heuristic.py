"""The scripted heuristic baseline: mutation-based program repair through the agent's tools.

It never sees the reference: it lists the workspace, runs the test modules, reads the lines of the
non-test modules that the tracebacks point at (most frequent first), and tries single-token edits
there -- the inverses of common slips: comparison flips (< <=, == !=, in / not in, is / is not),
arithmetic swaps (+ -, * /), and/or, True/False, an integer literal +-1, adding or removing a `not`.
An edit that lowers the number of failing tests is kept, one that does not is reverted; it
finishes when the tests pass or its budget of test runs is spent, and it says honestly whether the
tests pass. It resolves simple single-bug tasks and never a feature, refactoring or migration task
that needs new code: a baseline between the null agent and the oracle.
"""
from __future__ import annotations

import re

from composer_jax.env.protocol import render_assistant

MAX_TEST_RUNS = 14
MAX_LINES = 4
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
    out = []
    m = _COND.match(code)
    if m:
        cond = m.group(2).strip()
        nm = re.match(r"^not\s*\((.*)\)$", cond) or re.match(r"^not\s+(\w[\w.]*)$", cond)
        out.append(f"{m.group(1)}{nm.group(1)}:" if nm else f"{m.group(1)}not ({cond}):")
    for pattern, repl in _SWAPS:
        for hit in re.finditer(pattern, code):
            out.append(code[:hit.start()] + repl + code[hit.end():])
    for hit in _INT.finditer(code):
        n = int(hit.group())
        for v in (n + 1, n - 1):
            if v >= 0:
                out.append(code[:hit.start()] + str(v) + code[hit.end():])
    seen, result = set(), []
    for c in out:
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
    if re.search(r"^OK\b", output, re.MULTILINE):
        return 0
    return None


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
        pat = "|".join(re.escape(m) for m in modules)
        cmd = (f"python -m unittest {' '.join(t[:-3] for t in tests)} 2>&1 | "
               f"grep -E '^  File \".*({pat})\", line|^(FAILED|OK)' | sort | uniq -c | sort -rn | head -n 60")
        out = yield ("run_terminal_cmd", {"command": cmd})
        fails, runs = count_failures(out), 1
        tried: set[tuple[str, int, str]] = set()
        while fails and runs < MAX_TEST_RUNS:
            improved = False
            for path, line in traceback_lines(out, modules)[:MAX_LINES]:
                window = yield ("read_file", {"target_file": path, "start_line": max(1, line - 1),
                                              "end_line": line + 1})
                got = dict((int(n), t) for n, t in re.findall(r"^\s*(\d+)\t(.*)$", window, re.MULTILINE))
                if line not in got:
                    continue
                ctx = [got[i] for i in sorted(got)]
                center = sorted(got).index(line)
                for mutant in line_mutants(got[line]):
                    if runs >= MAX_TEST_RUNS or (path, line, mutant) in tried:
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
                if improved or not fails:
                    break
            if not improved:
                break
        if fails == 0:
            yield ("finish", {"message": "Fixed: the test suite passes now."})
        else:
            yield ("finish", {"message": f"I could not fix it: {fails if fails is not None else 'some'} "
                                         f"tests still fail."})
