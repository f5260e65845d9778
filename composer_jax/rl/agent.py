"""The token-level agent moved to `composer_jax.agent.token_agent`; this keeps the old path."""
from composer_jax.agent.token_agent import (AgentConfig, Policy, ScriptedPolicy,  # noqa: F401
                                            SeededTurns, TokenAgent, TurnRequest, initial_from,
                                            sampling_policy)
