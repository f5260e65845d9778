"""A short version of the `cpt_debug` experiment: real local code, the real config, and the
validation loss must fall clearly (the full run is marked slow)."""
import dataclasses
import json

import pytest

from composer_jax.overrides import apply_overrides


def _run(tmp_path, steps):
    from composer_jax.config import SECTION_PRESETS
    from composer_jax.registry import get
    exp = get("cpt_debug")
    cfg = exp.make_config()
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(
        cfg.train, steps=steps, eval_every=steps // 4, checkpoint_every=steps))
    cfg = apply_overrides(cfg, [], SECTION_PRESETS)          # validated like the CLI does
    exp.run(cfg, tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    mtp = [r["mtp_loss"] for r in rows if "mtp_loss" in r]
    assert all(isinstance(r["loss"], float) for r in rows), "a logged loss is NaN/Inf"
    return val, mtp


def test_cpt_debug_short_learns(tmp_path):
    val, mtp = _run(tmp_path, steps=120)
    assert val[-1] <= 0.85 * val[0], val
    assert mtp[-1] < mtp[0] - 0.5, mtp


@pytest.mark.slow
def test_cpt_debug_full_meets_acceptance(tmp_path):
    val, mtp = _run(tmp_path, steps=320)
    assert val[-1] <= 0.70 * val[0], val
    assert mtp[-1] < mtp[0], mtp
