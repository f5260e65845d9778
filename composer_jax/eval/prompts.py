"""The two prompt styles of every suite task.

  terse     what a developer would type: short, ambiguous, no test names and no file list (only
            the module or symbol a request would name). Several phrasings per category; the one a
            task gets is fixed by a hash of its id, so a suite is reproducible.
  detailed  the environment's statement, plus the files to edit, every failing test (up to a cap)
            and how to run them.
"""
from __future__ import annotations

import hashlib
import re

from composer_jax.env.tasks.task import Task

STYLES = ("terse", "detailed")
MAX_LISTED_TESTS = 12

_TERSE = {
    "debugging": (
        "{module} is giving wrong results somewhere, can you fix it?",
        "something in {module} broke recently. please track it down and fix",
        "there is a bug (maybe more than one) in {module}. fix it",
    ),
    "feature": (
        "parts of {module} were never finished. please implement what's missing",
        "finish the unimplemented bits of {module}",
        "please implement {what}, it's still missing",
    ),
    "refactoring": (
        "rename {rename} in {module}, no aliases please",
        "can you rename {rename}? it's in {module}",
        "please finish the refactor of {module} that the tests expect",
    ),
    "migration": (
        "we upgraded python and {module} no longer matches the new tests. port it",
        "{module} is an old version, please update it to the current behaviour",
    ),
}


def _pick(options: tuple, key: str) -> str:
    return options[int(hashlib.sha256(key.encode()).hexdigest(), 16) % len(options)]


def _feature_what(task: Task) -> str:
    names = [m.split(" of ", 1)[1].split(" (", 1)[0] for m in task.mutations if " of " in m]
    if len(names) != 1:
        return "the missing functions" if names else "the missing code"
    return names[0] if "`" in names[0] else f"`{names[0]}`"   # large_feature labels quote already


def _rename(task: Task) -> str:
    for m in task.mutations:
        hit = re.match(r"rename \w+ (\S+) -> (\S+)", m)
        if hit:
            return f"`{hit.group(1)}` to `{hit.group(2)}`"
    return "what the tests expect"


def terse_prompt(task: Task, category: str) -> str:
    """A short, ambiguous request: no test ids, no file names."""
    text = _pick(_TERSE[category], task.task_id)
    return text.format(module=f"the {task.module} module", what=_feature_what(task),
                       rename=_rename(task))


def detailed_prompt(task: Task, category: str) -> str:
    """The environment's statement plus the files to edit, the failing tests and a test command."""
    tests = list(task.fail_to_pass[:MAX_LISTED_TESTS])
    more = len(task.fail_to_pass) - len(tests)
    test_modules = sorted({t.split(".")[0] for t in task.test_ids})
    lines = [task.problem_statement.strip(), "",
             f"Files to change: {', '.join(task.edit_files)}.",
             f"Tests that must pass after the change ({len(task.fail_to_pass)} currently failing):"]
    lines += [f"  - {t}" for t in tests]
    if more > 0:
        lines.append(f"  - ... and {more} more")
    lines += [f"Keep the other {len(task.pass_to_pass)} tests of {', '.join(test_modules)} passing, "
              f"do not edit the test files, and run `python -m unittest {' '.join(test_modules)}` "
              f"before you finish."]
    return "\n".join(lines)


def prompts(task: Task, category: str) -> dict[str, str]:
    """{style: prompt} for both styles."""
    return {"terse": terse_prompt(task, category), "detailed": detailed_prompt(task, category)}
