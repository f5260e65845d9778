"""The one list of held-out modules, shared by the pretraining corpus and the task generators.

Modules named here (by their top-level stdlib/package module name, e.g. "textwrap" covers
`textwrap.py`, a `textwrap/` package and its test file `test/test_textwrap.py`) are kept out of the
pretraining corpus and only ever produce *evaluation* tasks, so evaluation never scores a model on
code it was trained on. Pure Python, no imports: the environment workers use it without JAX.
"""

HELDOUT_MODULES: frozenset[str] = frozenset({
    "bisect",
    "colorsys",
    "difflib",
    "fractions",
    "heapq",
    "shlex",
    "statistics",
    "textwrap",
})


def is_heldout_path(relpath: str) -> bool:
    """True if a path relative to a library root belongs to a held-out module or its tests.

    Examples: "textwrap.py", "test/test_textwrap.py", "statistics/__init__.py" -> True.
    """
    parts = relpath.replace("\\", "/").split("/")
    stem = parts[0][:-3] if parts[0].endswith(".py") else parts[0]
    if stem in HELDOUT_MODULES:
        return True
    name = parts[-1][:-3] if parts[-1].endswith(".py") else parts[-1]
    return name.startswith("test_") and name[len("test_"):] in HELDOUT_MODULES
