"""env/ is the bottom layer of the agent stack: it imports nothing from agent, rl, train,
inference or model (the episode loop is passed in by the caller, e.g. `experiments/env.py`)."""
import ast
import pathlib

import composer_jax.env

FORBIDDEN = ("agent", "rl", "train", "inference", "model")


def _imports(path: pathlib.Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module


def test_env_imports_nothing_from_the_layers_above():
    root = pathlib.Path(composer_jax.env.__file__).parent
    bad = sorted(f"{p.relative_to(root)}: {m}" for p in root.rglob("*.py") for m in _imports(p)
                 if m.split(".")[:2] in [["composer_jax", f] for f in FORBIDDEN])
    assert bad == []
