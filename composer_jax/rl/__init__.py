"""Reinforcement learning: rollout records, the token-level agent, the RL update step and its
orchestration.

`composer_jax.rl.rollout` (the `Rollout` record) is numpy-only so environment workers and Ray
actors can import it without JAX; this package's `__init__` therefore imports nothing heavy.
Import submodules directly: `from composer_jax.rl.rollout import Rollout`,
`from composer_jax.rl.agent import TokenAgent`.
"""
