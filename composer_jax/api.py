"""The public Python API for configs: what `launch.py` does with flags, callable from a notebook.

    from composer_jax.api import make_config, describe_config
    cfg = make_config("cpt_debug", {"train.steps": 20, "model.num_layers": 2})   # an experiment
    cfg = make_config("tiny", ["train.lr=3e-4", "data.seq_len=64"])              # a model preset
    cfg = make_config("runs/x/config.json", ["train.steps=10"])                  # a saved run
    print(describe_config(cfg))       # every key with its type, value and default

Overrides are exactly `launch.py --set` (typed, validated once at the end, an unknown key names the
valid ones): a list of "key.path=value" strings, or a dict whose values may be Python values
(`True`, `3e-4`, `("a", "b")`, an enum member). Nothing here imports JAX; `enable_compilation_cache`
imports it when called.
"""
from __future__ import annotations

import enum
import json
import os
from collections.abc import Mapping, Sequence

from composer_jax import registry
from composer_jax.config import (MODEL_PRESETS, MODEL_PRESET_EXECUTION, SECTION_PRESETS, Config,
                                 ExecutionConfig, from_dict, to_dict)
from composer_jax.data.config import resolved_cache_dir
from composer_jax.errors import ConfigError
from composer_jax.overrides import apply_overrides, config_keys

__all__ = ["make_config", "load_config", "save_config", "describe_config", "config_keys",
           "enable_compilation_cache", "override_strings"]


def _text(value) -> str:
    """A Python value as `--set` text."""
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return ",".join(_text(v) for v in value)
    if value is None:
        return "none"
    return str(value)


def override_strings(overrides: Mapping | Sequence[str] | None) -> list[str]:
    """`overrides` as a list of "key=value" strings (a dict's values formatted like `--set`)."""
    if overrides is None:
        return []
    if isinstance(overrides, str):
        return [overrides]
    if isinstance(overrides, Mapping):
        return [f"{k}={_text(v)}" for k, v in overrides.items()]
    return [str(o) for o in overrides]


def load_config(path) -> Config:
    """The Config saved in a run's config.json (any local or etils.epath path, e.g. gs://...).

    Keys a newer version added take their defaults; an unknown key is a ConfigError naming it."""
    from etils import epath
    p = epath.Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.exists():
        raise ConfigError(f"config file {str(p)!r} does not exist (pass a run's WORKDIR/config.json)")
    try:
        d = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"config file {str(p)!r} is not valid JSON: {e}") from None
    return from_dict(Config, d)


def save_config(cfg: Config, path) -> None:
    """Writes `cfg` as JSON to `path` (atomically on local disks; as one object on gs:// etc.);
    an identical file is left untouched (rerunning a finished run changes nothing)."""
    from etils import epath
    p = epath.Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(to_dict(cfg), indent=2)
    if p.exists() and p.read_text() == text:
        return
    if "://" in str(path):
        p.write_text(text)              # object stores write whole objects atomically
        return
    tmp = p.parent / f"{p.name}.tmp{os.getpid()}"
    tmp.write_text(text)
    tmp.replace(p)


def _base_config(base) -> Config:
    if isinstance(base, Config):
        return base
    if base is None:
        return Config()
    text = os.fspath(base)
    if text in MODEL_PRESETS:
        return Config(model=MODEL_PRESETS[text](),
                      execution=MODEL_PRESET_EXECUTION.get(text, ExecutionConfig)())
    if text.endswith(".json") or "/" in text or os.sep in text:
        return load_config(text)
    exps = registry.load_all()
    if text in exps:
        return exps[text].make_config()
    raise ConfigError(f"make_config: {text!r} is not a model preset ({', '.join(MODEL_PRESETS)}), an "
                      f"experiment ({', '.join(sorted(exps))}) or a config.json path")


def make_config(base: Config | str | os.PathLike | None = "tiny",
                overrides: Mapping | Sequence[str] | None = None) -> Config:
    """A validated Config: `base` with `overrides` applied like `launch.py --set`.

    base: a Config; a model preset name ("tiny", "small", "kimi_k2_5", "deepseek_v3": the default
    Config with that model, and bf16 execution for the two large ones); a registered experiment name ("cpt_debug", ...: its default config);
    or a path to a saved config.json / run directory. None means `Config()`.
    overrides: ["train.lr=3e-4", "model=small"] or {"train.lr": 3e-4, "data.roots": ("a", "b")}.
    Raises ConfigError for an unknown key, a badly typed value or an invalid combination.
    """
    return apply_overrides(_base_config(base), override_strings(overrides), SECTION_PRESETS,
                           rebase=_experiment_rebase(base))


def _experiment_rebase(base):
    """The `rebase` of the experiment `base` names (launch.py applies it too), else None."""
    if isinstance(base, str) and base not in MODEL_PRESETS:
        exp = registry.load_all().get(base)
        return exp.rebase if exp is not None else None
    return None


def describe_config(cfg: Config | None = None, defaults: Config | None = None,
                    values: bool = True) -> str:
    """A table of every config key: its type, its value in `cfg` and its default (the dataclass
    default, or its value in `defaults`). Rows whose value differs from the default start with '*';
    `values=False` leaves the value column out (the key list of `launch.py --help`)."""
    rows = config_keys(cfg or Config(), defaults)

    def short(v):
        v = repr(v)
        return v if len(v) <= 40 else v[:37] + "..."
    wk = max(len(r.key) for r in rows)
    wt = max(len(r.type_name) for r in rows)
    wv = max(len(short(r.value)) for r in rows)
    head = [f"  {'key':<{wk}}  {'type':<{wt}}  " + (f"{'value':<{wv}}  " if values else "")
            + "default"]
    lines = []
    for r in rows:
        mark = "*" if values and r.value != r.default else " "
        val = f"{short(r.value):<{wv}}  " if values else ""
        lines.append(f"{mark} {r.key:<{wk}}  {r.type_name:<{wt}}  {val}{short(r.default)}")
    return "\n".join(head + lines)


def enable_compilation_cache(cfg: Config | None = None, directory: str | None = None) -> str | None:
    """Turns on JAX's persistent compilation cache under `<cache dir>/jax_compilation` (the data
    cache directory: data.cache_dir, else $COMPOSER_JAX_CACHE, else ~/.cache/composer_jax), unless
    `train.compilation_cache` is false. Returns the directory used (None when off)."""
    cfg = cfg or Config()
    if not getattr(cfg.train, "compilation_cache", True):
        return None
    if directory is None:
        directory = os.path.join(resolved_cache_dir(cfg.data), "jax_compilation")
    import jax
    if "://" not in directory:
        os.makedirs(directory, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", directory)
    # Cache every program that took a second or more to compile (the default), at any size.
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return directory
