"""Reading configs written before the `execution` section and the nested `rl` sections existed
(old config.json files and old `--set model.KEY=...` / `--set rl.KEY=...` spellings)."""
from __future__ import annotations

from composer_jax.config.rl import MOVED_RL_KEYS, migrate_legacy_rl


# Keys that moved out of `model` (old config.json files and old `--set model.KEY=...` spellings):
# model.KEY -> SECTION.KEY.
MOVED_MODEL_KEYS = {
    "remat": "execution", "precision": "execution", "moe_impl": "execution",
    "attention_kv_block": "execution", "moe_capacity_factor": "execution",
    "quant_bf16_last_blocks": "execution", "param_dtype": "execution",
    "compute_dtype": "execution", "router_bias_update_rate": "train",
    "seq_aux_loss_coef": "train", "init_std": "train"}


def moved_key(key: str) -> str | None:
    """The new spelling of an old dotted config key (`model.remat`, `rl.backend`, ...), else None."""
    head, _, rest = key.partition(".")
    if head == "model" and rest in MOVED_MODEL_KEYS:
        return f"{MOVED_MODEL_KEYS[rest]}.{rest}"
    if head == "rl" and rest in MOVED_RL_KEYS:
        return f"rl.{MOVED_RL_KEYS[rest]}"
    return None


def split_legacy_model(model: dict) -> tuple[dict, dict[str, dict]]:
    """A model section dict in the old layout -> (architecture dict, {section: moved fields})."""
    arch = {k: v for k, v in model.items() if k not in MOVED_MODEL_KEYS}
    moved: dict[str, dict] = {}
    for k, v in model.items():
        if k in MOVED_MODEL_KEYS:
            moved.setdefault(MOVED_MODEL_KEYS[k], {})[k] = v
    return arch, moved


def migrate_legacy_config(d: dict) -> dict:
    """A Config dict (config.json) written before the `execution` section existed, in today's
    layout: model.remat etc. move to `execution`, model.router_bias_update_rate,
    seq_aux_loss_coef and init_std to `train` (a value already in the new place wins).
    The flat rl section becomes rl.task / rl.job / rl.weight_sync (`migrate_legacy_rl`).
    Dicts in today's layout come back unchanged."""
    if isinstance(d.get("rl"), dict) and set(d["rl"]) & set(MOVED_RL_KEYS):
        d = dict(d, rl=migrate_legacy_rl(d["rl"]))
    if not isinstance(d.get("model"), dict) or not set(d["model"]) & set(MOVED_MODEL_KEYS):
        return d
    arch, moved = split_legacy_model(d["model"])
    out = dict(d, model=arch)
    for section, fields in moved.items():
        out[section] = {**fields, **(d.get(section) or {})}
    return out
