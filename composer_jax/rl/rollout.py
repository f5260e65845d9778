"""The rollout record moved to `composer_jax.agent.rollout` (the agent package, below rl/ and
eval/); this module keeps the old import path working."""
from composer_jax.agent.rollout import *  # noqa: F401,F403
from composer_jax.agent.rollout import (_DIGEST, _PREFIX, END_EPISODE, END_ERROR,  # noqa: F401
                                        END_SUMMARIZED, FORMAT_VERSION, MAGIC, NO_EXPERT,
                                        NO_VERSION, Rollout, RolloutFormatError, Segment,
                                        SegmentBuilder, Turn, atomic_write_bytes)
