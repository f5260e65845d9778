"""Rerunning into a workdir that holds a run: its config.json is the run's record, so a command
whose settings differ from it is refused (naming the keys) unless the difference is one a restart
takes up (`RESTART_KEYS`: more steps, how the model is computed or laid out, which sweep cells to
run) or --rewrite_config says to continue with the new settings. Nothing is written when refused.
"""
from __future__ import annotations

import json

from composer_jax.api import load_config
from composer_jax.errors import ConfigError
from composer_jax.overrides import config_keys

# Key prefixes whose change a resumed run takes up (the rest would be silently ignored by a finished
# run, or contradict its checkpoints).
RESTART_KEYS = ("train.steps", "rl.steps", "execution.", "mesh.", "sweep.report_only",
                "sweep.cells")


def config_changes(old, new) -> list[tuple[str, object, object]]:
    """(key, old value, new value) of every key whose value differs between two configs."""
    before = {k.key: k.value for k in config_keys(old)}
    after = {k.key: k.value for k in config_keys(new)}
    return [(k, before.get(k), after.get(k)) for k in sorted(set(before) | set(after))
            if before.get(k) != after.get(k)]


def check_rerun(cfg, workdir, rewrite: bool = False) -> None:
    """Raises ConfigError when WORKDIR/config.json records other settings than `cfg` in keys
    outside RESTART_KEYS (and `rewrite` is False)."""
    path = workdir / "config.json"
    if rewrite or not path.exists():
        return
    try:
        old = load_config(path)
    except (ConfigError, json.JSONDecodeError):
        return      # not a config this version reads: the run's own restore says what is wrong
    changed = [c for c in config_changes(old, cfg) if not c[0].startswith(RESTART_KEYS)]
    if changed:
        shown = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in changed[:6])
        more = f" (and {len(changed) - 6} more)" if len(changed) > 6 else ""
        raise ConfigError(f"{workdir} already holds a run whose config.json differs: {shown}{more}. "
                          f"Nothing was run or written. Use --workdir=NEW_DIR for a run with these "
                          f"settings, or --rewrite_config to continue this run with them")
