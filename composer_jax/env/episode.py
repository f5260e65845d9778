"""The episode loop moved to `composer_jax.agent.episode` (the agent package: one loop for the
text-level episodes, RL and eval); this module keeps the old import path working."""
from composer_jax.agent.episode import (AgentTurn, Episode, approx_tokens,  # noqa: F401
                                        approx_tokens_chars4, execute_call, initial_messages,
                                        run_episode, run_loop)
