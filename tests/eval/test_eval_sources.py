"""The evaluation pool's key is a content hash of the task generators' code and what it imports:
a change there names a new pool (so it is rebuilt), a change elsewhere does not."""
import dataclasses
import pathlib
import shutil

import composer_jax
from composer_jax.config import Config, EvalConfig
from composer_jax.eval import api
from composer_jax.eval.sources import import_closure, sources_hash, task_generator_hash

PKG = pathlib.Path(composer_jax.__file__).resolve().parent


def _write(root, rel, text):
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def test_closure_follows_absolute_relative_and_lazy_imports(tmp_path):
    root = tmp_path / "pkg"
    _write(root, "__init__.py", "")
    _write(root, "gen/__init__.py", "")
    _write(root, "gen/a.py", "from pkg.util import helper\nfrom . import b\n")
    _write(root, "gen/b.py", "def f():\n    from ..deep import x\n    import json\n")
    _write(root, "util/__init__.py", "")
    _write(root, "util/helper.py", "X = 1\n")
    _write(root, "deep.py", "import pkg.leaf\n")
    _write(root, "leaf.py", "")
    _write(root, "unrelated.py", "import pkg.gen.a\n")
    got = {f.relative_to(root.resolve()).as_posix() for f in import_closure(root, [root / "gen/a.py"])}
    assert got == {"__init__.py", "gen/__init__.py", "gen/a.py", "gen/b.py", "util/__init__.py",
                   "util/helper.py", "deep.py", "leaf.py"}
    h0 = sources_hash(root, [root / "gen/a.py"])
    _write(root, "unrelated.py", "import pkg.gen.a\nY = 2\n")
    assert sources_hash(root, [root / "gen/a.py"]) == h0
    _write(root, "leaf.py", '"""Doc."""\n# note\n')          # documentation only: same hash
    assert sources_hash(root, [root / "gen/a.py"]) == h0
    _write(root, "leaf.py", "Z = 3\n")                      # reached only through a lazy import
    assert sources_hash(root, [root / "gen/a.py"]) != h0


def test_real_generator_closure_and_a_copy_with_an_edited_generator(tmp_path):
    files = {f.relative_to(PKG).as_posix()
             for f in import_closure(PKG, sorted((PKG / "env/tasks").glob("*.py")))}
    assert {"env/tasks/generate.py", "env/tasks/mutate.py", "env/tasks/validate.py",
            "heldout.py", "env/sandbox.py"} <= files
    assert not any(f.startswith(("model/", "train/", "eval/", "rl/")) for f in files)
    copy = tmp_path / "composer_jax"
    shutil.copytree(PKG, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    entries = lambda: sorted((copy / "env/tasks").glob("*.py"))   # noqa: E731
    assert sources_hash(copy, entries()) == task_generator_hash()
    (copy / "eval/report.py").write_text("# outside the closure\n")
    assert sources_hash(copy, entries()) == task_generator_hash()
    mutate = copy / "env/tasks/mutate.py"
    text = mutate.read_text()
    assert text.startswith('"""')
    mutate.write_text(text.replace('"""', '"""An edited docstring. ', 1) + "\n# a comment\n")
    assert sources_hash(copy, entries()) == task_generator_hash()
    mutate.write_text(mutate.read_text() + "\n_A_GENERATOR_CHANGE = 1\n")
    assert sources_hash(copy, entries()) != task_generator_hash()


def test_pool_and_suite_directories_follow_the_generator_hash(tmp_path, monkeypatch):
    cfg = dataclasses.replace(Config(), eval=EvalConfig())
    monkeypatch.setenv("COMPOSER_JAX_CACHE", str(tmp_path))
    k_real = api.pool_key(cfg)
    assert k_real == api.pool_key(cfg, task_generator_hash())
    assert api.pool_key(cfg, "0" * 64) != k_real
    pool, suite = api.eval_pool_dir(cfg), api.suite_dir(cfg)
    monkeypatch.setattr(api, "task_generator_hash", lambda: "edited")
    assert api.eval_pool_dir(cfg) != pool and api.suite_dir(cfg) != suite
    assert api.eval_pool_dir(cfg).name == api.pool_key(cfg, "edited")
