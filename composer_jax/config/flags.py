"""Every config key as an absl flag: `--config.rl.lr=3e-4`, `--config.model=small`.

The flags are ml_collections' (`config_flags.DEFINE_config_dict`): a locked, type-safe ConfigDict
holds the config's dict form; each key is a flag `config.KEY` parsed by absl (int, float, bool,
str, tuples as `(1, 2)`, `a,b` or a repeated flag), with its help from the field's comment or
docstring (`help.field_help`). After parsing, the frozen dataclass is rebuilt from the dict, so
every section's validation runs once, on the whole config. (Why not `DEFINE_config_dataclass`:
it assigns each override with setattr, which frozen dataclasses refuse.)

A value naming a whole section is a preset: `--config.model=small`, `--config.execution=bf16`,
`--config.rl.task=lookup` (a task family's defaults; a dotted name is a plug-in family module).
Presets are applied to the base config before the per-key flags are defined, so the keys of the
chosen preset (e.g. the lookup family's `rl.task.max_turns`) are flags too.

`--set KEY=VALUE` is an alias of `--config.KEY=VALUE` (`alias_set_flags`).
"""
from __future__ import annotations

import ast
import dataclasses
import enum
import re
import typing

from absl import flags
from ml_collections import config_dict, config_flags

from composer_jax.config.build import build_dataclass, field_types
from composer_jax.config.help import field_help
from composer_jax.config.legacy import moved_key
from composer_jax.errors import ConfigError

NAME = "config"
_OVERRIDE = re.compile(rf"^--?(?:no)?{NAME}\.([^=]+)(?:=(.*))?$", re.S)


# ---------------------------------------------------------------------------------------------
# argv: the --set alias and the presets
# ---------------------------------------------------------------------------------------------


def alias_set_flags(argv: list[str]) -> list[str]:
    """argv with each `--set KEY=VALUE` (or `--set=KEY=VALUE`) spelled `--config.KEY=VALUE`."""
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--set", "-set") and i + 1 < len(argv):
            arg, i = "--set=" + argv[i + 1], i + 1
        if arg.startswith(("--set=", "-set=")):
            item = arg.split("=", 1)[1]
            if "=" not in item:
                raise ConfigError(f"--set {item!r} must look like key.path=value")
            arg = f"--{NAME}.{item}"
        out.append(arg)
        i += 1
    return out


def without_config_file(argv: list[str]) -> list[str]:
    """argv without `--config=FILE` / `--config FILE` (the saved config the caller loads as the
    base; the `--config` flag itself holds the config)."""
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
        elif re.match(rf"^--?{NAME}=", arg):
            continue
        elif arg in (f"--{NAME}", f"-{NAME}") and i + 1 < len(argv):
            skip = True
        else:
            out.append(arg)
    return out


def overrides_in(argv: list[str]) -> list[tuple[str, str | None]]:
    """The (key, text) of each `--config.KEY[=VALUE]` in argv, in order (text None: `--config.KEY`
    given alone, a boolean set to true)."""
    out = []
    for arg in argv:
        m = _OVERRIDE.match(arg)
        if m:
            key, text = m.group(1), m.group(2)
            if text is None and arg.lstrip("-").startswith("no"):
                text = "false"
            out.append((key, text))
    return out


def _section_at(cfg, key: str):
    """(declared type, value) of the dotted key in cfg, or None when it names no section."""
    obj, typ = cfg, type(cfg)
    for part in key.split("."):
        if not dataclasses.is_dataclass(obj) or part not in {f.name for f in dataclasses.fields(obj)}:
            return None
        typ, obj = field_types(type(obj))[part], getattr(obj, part)
    return (typ, obj) if dataclasses.is_dataclass(obj) else None


def _replace_at(cfg, key: str, value):
    head, _, rest = key.partition(".")
    if not rest:
        return dataclasses.replace(cfg, **{head: value})
    return dataclasses.replace(cfg, **{head: _replace_at(getattr(cfg, head), rest, value)})


def apply_presets(cfg, argv: list[str], presets: dict) -> tuple[object, list[str]]:
    """Applies each `--config.SECTION=NAME` of argv (a preset of a whole section) to cfg, in order,
    and returns (cfg, argv without them). A key of a section set before the section's preset is
    refused (the preset would silently replace it)."""
    rest, seen = [], []
    for arg in argv:
        m = _OVERRIDE.match(arg)
        key = m.group(1) if m else None
        if key is None or _section_at(cfg, key) is None:
            if key is not None:
                seen.append(key)
            rest.append(arg)
            continue
        name = m.group(2) or ""
        early = [k for k in seen if k.startswith(key + ".")]
        if early:
            raise ConfigError(f"--{NAME}.{key}={name} comes after --{NAME}.{early[0]}, which it "
                              f"would replace; put the section's preset first")
        table = presets
        for part in key.split("."):
            table = table.get(part) if isinstance(table, dict) else None
        if not isinstance(table, dict):
            raise ConfigError(f"{key} is a section: set its keys ({key}.KEY=VALUE); it has no "
                              f"presets")
        try:
            make = table[name]           # a task family's lookup raises the family's own error
        except KeyError:
            raise ConfigError(f"{key}: unknown preset name {name!r}; preset names: {sorted(table)} (or set "
                              f"its keys, {key}.KEY=VALUE)") from None
        cfg = _replace_at(cfg, key, make())
    return cfg, _quote_tuple_words(cfg, rest)


def _quote_tuple_words(cfg, argv: list[str]) -> list[str]:
    """argv with each tuple key's `a=1,b.c=2` (elements that are not Python literals, which
    ml_collections' tuple parser refuses) spelled as a tuple of strings, `('a=1', 'b.c=2')`."""
    tuple_keys = {k for k, typ, *_ in leaf_keys(cfg) if typing.get_origin(typ) is tuple}
    out = []
    for arg in argv:
        m = _OVERRIDE.match(arg)
        if m and m.group(1) in tuple_keys and m.group(2):
            try:
                ast.literal_eval(m.group(2) if m.group(2).lstrip().startswith("(")
                                 else f"({m.group(2)},)")
            except (ValueError, SyntaxError):
                words = tuple(w.strip() for w in m.group(2).split(",") if w.strip())
                arg = f"--{NAME}.{m.group(1)}={words!r}"
        out.append(arg)
    return out


# ---------------------------------------------------------------------------------------------
# The config flag
# ---------------------------------------------------------------------------------------------


def _plain(value):
    """A config value in ConfigDict form: enums as their values, sections as dicts, tuples kept."""
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (tuple, list)):
        return tuple(_plain(v) for v in value)
    return value


def leaf_keys(cfg, prefix: str = "") -> list[tuple[str, type, object, str]]:
    """(dotted key, declared type, value, help) of every leaf of config dataclass `cfg`."""
    out, hints, helps = [], field_types(type(cfg)), field_help(type(cfg))
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            out += leaf_keys(value, prefix + f.name + ".")
        else:
            out.append((prefix + f.name, hints[f.name], value, helps.get(f.name, "")))
    return out


def _unknown_key_error(cfg, key: str) -> ConfigError:
    new = moved_key(key)
    if new is not None:
        why = ("the model section holds the architecture only" if key.startswith("model.")
               else "the rl section has the sections rl.task, rl.job and rl.weight_sync")
        return ConfigError(f"config key {key!r} has moved to {new!r} ({why}); use "
                           f"--{NAME}.{new}=...")
    obj, prefix = cfg, ""
    for part in key.split("."):
        names = [f.name for f in dataclasses.fields(obj)] if dataclasses.is_dataclass(obj) else []
        if part not in names:
            if not names:
                return ConfigError(f"{prefix.rstrip('.')} is a value, not a section; cannot set "
                                   f"{key!r}")
            return ConfigError(f"unknown config key {prefix + part!r}; valid keys at this level: "
                               f"{', '.join(prefix + n for n in names)}")
        obj, prefix = getattr(obj, part), prefix + part + "."
    return ConfigError(f"cannot set config key {key!r}")


def define_config_flag(cfg, flag_values: flags.FlagValues, argv: list[str],
                       every_key: bool = False) -> flags.FlagHolder:
    """Defines `--config` on flag_values: one `--config.KEY` flag per key that argv overrides (all
    keys with every_key=True, for --helpfull), each with its field's help. argv: the command line
    after `apply_presets`. Raises ConfigError for an unknown or moved key."""
    keys = leaf_keys(cfg)
    known = {k for k, *_ in keys}
    for key, _ in overrides_in(argv):
        if key not in known:
            raise _unknown_key_error(cfg, key)
    wanted = [f"--{NAME}.{k}" for k, *_ in keys] if every_key else []
    holder = config_flags.DEFINE_config_dict(
        NAME, config_dict.ConfigDict(_plain(cfg)), "the run's configuration: every key is a flag "
        "--config.KEY=VALUE (alias --set KEY=VALUE); --show_config prints them with values",
        flag_values=flag_values, sys_argv=list(argv) + wanted)
    for key, typ, value, text in keys:
        name = f"{NAME}.{key}"
        if name in flag_values:
            kind = typ.__name__ if isinstance(typ, type) else str(typ)
            if isinstance(typ, type) and issubclass(typ, enum.Enum):
                kind = "one of " + "|".join(m.value for m in typ)
            flag_values[name].help = f"{text} [{kind}]" if text else f"[{kind}]"
    return holder


def _split_commas(value: tuple) -> tuple:
    """A tuple given as `a,b` arrives as one string `"a,b"`: its elements."""
    out = []
    for v in value:
        out += [s.strip() for s in v.split(",") if s.strip()] if isinstance(v, str) else [v]
    return tuple(out)


def config_from_flag(cfg, holder: flags.FlagHolder, argv: list[str]):
    """The validated frozen config: cfg's class rebuilt from the parsed flag's values (tuple
    overrides given as `a,b` split; each value converted to its field's type)."""
    d = holder.value.to_dict()
    tuple_keys = {k for k, typ, *_ in leaf_keys(cfg) if typing.get_origin(typ) is tuple}
    for key, _ in overrides_in(argv):
        if key in tuple_keys:
            node = d
            *path, leaf = key.split(".")
            for p in path:
                node = node[p]
            node[leaf] = _split_commas(tuple(node[leaf]))
    return build_dataclass(type(cfg), d)


def parse_config(cfg, argv: list[str], presets: dict):
    """cfg with the `--config.KEY=VALUE` / `--set KEY=VALUE` of argv applied, validated once at the
    end (so `train.steps=4 train.warmup_steps=1` works in either order); the same flags as
    launch.py, on a private FlagValues. Raises ConfigError."""
    argv = alias_set_flags(["parse_config", *argv])
    cfg, argv = apply_presets(cfg, argv, presets)
    fv = flags.FlagValues()
    holder = define_config_flag(cfg, fv, argv)
    try:
        fv(argv)
    except flags.Error as e:
        raise ConfigError(flag_error_text(e, cfg)) from None
    return config_from_flag(cfg, holder, argv)


def override_args(argv: list[str]) -> list[str]:
    """The `--config.KEY[=VALUE]` arguments of argv, in order (after `alias_set_flags`)."""
    return [arg for arg in argv if _OVERRIDE.match(arg)]


def rebased_config(cfg, argv: list[str], presets: dict, rebase):
    """`cfg` (parsed from argv) re-parsed on the base config `rebase(cfg)` chooses, or `cfg` when
    it returns None. `rebase(cfg) -> (base, keys)`: the defaults a run of cfg starts from (e.g. a
    task family's whole experiment settings) and the section keys whose preset `base` already
    holds (not applied again, so the family's section values stay). Every other override of argv
    is applied on `base`, so what the user set wins over the family's defaults, whatever its
    value (also one equal to the first base's default)."""
    chosen = rebase(cfg)
    if chosen is None:
        return cfg
    base, keys = chosen
    args = [a for a in override_args(argv) if _OVERRIDE.match(a).group(1) not in keys]
    return parse_config(base, args, presets)


_ARTICLE = {int: "an int", float: "a float", bool: "a bool (true/false)", str: "a str"}


def flag_error_text(e: Exception, cfg=None) -> str:
    """absl's message for a bad flag value, in config-key terms (`expected a float, got 'x'`)."""
    m = re.match(rf"flag --{NAME}\.([^=]+)=(.*?): (.*)", str(e), re.S)
    if not m:
        return str(e)
    key, value, why = m.groups()
    typ = {k: t for k, t, *_ in leaf_keys(cfg)}.get(key) if cfg is not None else None
    want = _ARTICLE.get(typ, getattr(typ, "__name__", "another value"))
    return f"config key {key}: expected {want}, got {value!r} ({why})"
