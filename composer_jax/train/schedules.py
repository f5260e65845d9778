"""Learning-rate schedules: warmup + cosine, warmup-stable-decay (WSD), constant."""
from __future__ import annotations

import optax

from composer_jax.config import Schedule, TrainConfig


def make_schedule(cfg: TrainConfig) -> optax.Schedule:
    """Step -> learning rate for `cfg.schedule`."""
    peak, floor = cfg.lr, cfg.lr * cfg.min_lr_ratio
    warmup = optax.linear_schedule(0.0, peak, max(cfg.warmup_steps, 1))
    rest = max(cfg.steps - cfg.warmup_steps, 1)
    if cfg.schedule == Schedule.COSINE:
        after = optax.cosine_decay_schedule(peak, rest, alpha=cfg.min_lr_ratio)
    elif cfg.schedule == Schedule.WSD:
        decay = max(int(round(cfg.steps * cfg.decay_fraction)), 1)
        stable = max(rest - decay, 0)
        after = optax.join_schedules(
            [optax.constant_schedule(peak), optax.linear_schedule(peak, floor, decay)], [stable])
    else:
        after = optax.constant_schedule(peak)
    if cfg.warmup_steps == 0:
        return after
    return optax.join_schedules([warmup, after], [cfg.warmup_steps])
