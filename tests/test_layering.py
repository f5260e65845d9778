"""Package layering: config sits below what it configures, eval and the agent package below rl."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1] / "composer_jax"


def _imports(package: str) -> set[tuple[str, str]]:
    """(file, imported composer_jax module) of every import in a package, lazy ones included."""
    out = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            out |= {(path.name, n) for n in names if n.startswith("composer_jax")}
    return out


def _offending(package: str, forbidden: tuple[str, ...]) -> list:
    return sorted((f, m) for f, m in _imports(package)
                  if any(m == p or m.startswith(p + ".") for p in forbidden))


def test_config_imports_nothing_it_configures():
    assert _offending("config", ("composer_jax.data", "composer_jax.env", "composer_jax.overrides",
                                 "composer_jax.rl", "composer_jax.agent", "composer_jax.eval",
                                 "composer_jax.model", "composer_jax.train")) == []


def test_eval_and_agent_import_nothing_from_rl():
    assert _offending("eval", ("composer_jax.rl",)) == []
    assert _offending("agent", ("composer_jax.rl", "composer_jax.eval")) == []
