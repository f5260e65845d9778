"""The ladder's level check: what the failing output shows, seen the way the agent sees it.

After the usual fail-before / pass-after validation (`validate.check_candidate`), the failing
tests are run once more on the broken module with plain `python -B -m unittest IDS` in the
sandbox's workspace (the command an agent types), and the merged output is read:

  level 1  every failing test's message is the site's exception (NameError, AttributeError,
           TypeError), the output matches the site's `expect` (the "Did you mean: 'x'?" hint for
           names and attributes), and a traceback frame names the module's file at the mutated
           line;
  level 2  no traceback frame names the mutated line of the module's file (the agent has to read
           the test and find the function).
"""
from __future__ import annotations

import re
import shlex

from composer_jax.env.tasks.ladder_sites import LadderSite

MAX_IDS = 8            # failing tests rerun for the check (the first, by id)
EXCEPTIONS = {"name": "NameError", "attribute": "AttributeError", "keyword": "TypeError"}


def frame_pattern(module_file: str, line: int) -> str:
    """A regex for a traceback frame of `module_file` (a workspace path) at `line`."""
    return rf'File "[^"\n]*/{re.escape(module_file)}", line {line}\b'


def check_output(site: LadderSite, module_file: str, output: str, messages: dict) -> str:
    """"" when `output` (the unittest run) and the runner's `messages` (test id -> "Exc: msg" of
    the failing tests) show what the site's level promises, else why not."""
    named = re.search(frame_pattern(module_file, site.mutation.line), output) is not None
    if site.level == 2:
        return f"level 2: the output names {module_file} line {site.mutation.line}" if named else ""
    exc = EXCEPTIONS[site.kind]
    other = sorted(t for t, m in messages.items() if not (m or "").startswith(exc + ":"))
    if other:
        return f"level 1: {other[0]} fails with {messages[other[0]][:80]!r}, not {exc}"
    if re.search(site.expect, output) is None:
        return f"level 1: the output lacks {site.expect!r}"
    if not named:
        return f"level 1: no traceback frame names {module_file} line {site.mutation.line}"
    return ""


def unittest_command(python_exe: str, test_ids) -> str:
    """The agent's own test command on `test_ids` (bytecode off: scratch files are rewritten)."""
    return " ".join(shlex.quote(a) for a in [python_exe, "-B", "-m", "unittest", *test_ids]) + \
        " 2>&1"


def level_check(sx, site: LadderSite, module_file: str, before: dict, fail_to_pass,
                messages: dict) -> str:
    """Runs the failing tests on `before` in scratch `sx` (a `validate.Scratch`); "" when the
    level's promise holds (module docstring), else why not."""
    ids = sorted(fail_to_pass)[:MAX_IDS]
    sx.sync(before)
    r = sx.sandbox.run(unittest_command(sx.py.executable, ids), timeout_s=sx.timeout)
    if r.timed_out:
        return "level check: the unittest run timed out"
    return check_output(site, module_file, r.output, {t: messages.get(t, "") for t in ids})
