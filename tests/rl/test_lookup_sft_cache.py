"""The lookup SFT cache is keyed by the code that makes the policy, not only by config: a policy
trained by other code (another branch, an edited demonstration or loss) is never read back."""
from composer_jax.rl.tasks import lookup_sft as ls


def _cfg():
    from composer_jax import registry
    return registry.get("rl_async").make_config()


def test_the_key_changes_with_the_code_and_with_a_variant_trainer(monkeypatch):
    cfg = _cfg()
    base = ls._key(cfg)
    assert base == ls._key(cfg)                              # stable in one process
    from composer_jax.rl.tasks import lookup_levels
    variant = next(f for f in vars(lookup_levels).values()
                   if callable(f) and getattr(f, "__module__", "") == lookup_levels.__name__)
    assert ls._key(cfg, train=variant) != base               # a variant's own trainer counts
    monkeypatch.setattr(ls, "_module_code_hash", lambda module: "edited")
    assert ls._key(cfg) != base                              # edited code: a new entry


def test_the_code_hash_covers_the_demonstrations_and_the_model():
    import pathlib

    from composer_jax.eval.sources import import_closure
    root = pathlib.Path(ls.__file__).resolve().parents[2]
    files = {p.relative_to(root).as_posix() for p in import_closure(root, [ls.__file__])}
    assert {"agent/lookup.py", "rl/tasks/lookup_sft.py", "train/step.py"} <= files
    assert any(f.startswith("model/") for f in files)
