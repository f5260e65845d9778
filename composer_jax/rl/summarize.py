"""Self-summarization moved to `composer_jax.agent.summarize`; this keeps the old import path."""
from composer_jax.agent.summarize import *  # noqa: F401,F403
from composer_jax.agent.summarize import (SUMMARY_PREAMBLE, SUMMARY_REQUEST,  # noqa: F401
                                          extract_summary, request_message, restart_messages,
                                          should_summarize, summary_message)
