"""Reinforcement learning: the RL update step, the services (trainer, inference, evaluators,
rollout jobs), the backends that place them, the driver (`run_rl`) and the registry of task
families (`rl.tasks`).

What an agent is (the episode loop, the token-level agent, rollout records, self-summarization,
the task-family protocol) lives below this package in `composer_jax.agent`, which never imports
JAX; the old paths `rl.rollout`, `rl.agent` and `rl.summarize` re-export it. This package's
`__init__` imports nothing heavy: import submodules directly.
"""
