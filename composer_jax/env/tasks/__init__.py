"""Offline task generation from local CPython code and installed packages, and the task pool.

  sources.py     which stdlib modules (with their test files) and package modules (with their
                 package's test suite) can become tasks
  mutate.py      bug injection by AST mutation (minimal text edits)
  candidates.py  candidate tasks of each kind: bug, feature, migration, multi_bug
  validate.py    fail-before / pass-after checks in the sandbox (twice, flaky ones rejected)
  testrun.py     running unittest ids in the sandbox (one-shot or warm fork server)
  generate.py    the resumable, parallel generation loop with progress
  pool.py, task.py, statements.py   the pool on disk, the Task record, problem statements
"""
