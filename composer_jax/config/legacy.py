"""Reading configs written before the `execution` section existed (old config.json files and
old `--set model.KEY=...` spellings)."""
from __future__ import annotations


# Keys that moved out of `model` (old config.json files and old `--set model.KEY=...` spellings):
# model.KEY -> SECTION.KEY.
MOVED_MODEL_KEYS = {
    "remat": "execution", "precision": "execution", "moe_impl": "execution",
    "attention_kv_block": "execution", "moe_capacity_factor": "execution",
    "quant_bf16_last_blocks": "execution", "param_dtype": "execution",
    "compute_dtype": "execution", "router_bias_update_rate": "train",
    "seq_aux_loss_coef": "train", "init_std": "train"}


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
    Dicts in today's layout come back unchanged."""
    if not isinstance(d.get("model"), dict) or not set(d["model"]) & set(MOVED_MODEL_KEYS):
        return d
    arch, moved = split_legacy_model(d["model"])
    out = dict(d, model=arch)
    for section, fields in moved.items():
        out[section] = {**fields, **(d.get(section) or {})}
    return out
