"""The RL evaluator's hook: a (random, tiny) model evaluated on a one-task suite end to end."""
import dataclasses

import pytest

from composer_jax.config import Config, EvalConfig, tiny
from composer_jax.env.sandbox import bwrap_works
from composer_jax.eval.suite import build_suite, load_suite
from eval_helpers import FIXED, TESTS, make_pool, make_task

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not bwrap_works(), reason="bubblewrap is not usable here")]


def test_eval_resolved_rate_on_a_random_model(tmp_path):
    from composer_jax.data.chat import encode_prompt
    from composer_jax.data.tokenizer import SplitPattern, train_tokenizer
    from composer_jax.agent.episode import initial_messages
    from composer_jax.env.tools import TOOL_SPECS
    from composer_jax.eval.api import eval_resolved_rate
    from composer_jax.model import init_model

    make_pool(tmp_path / "pool", [make_task()])
    build_suite(tmp_path / "pool", tmp_path / "suite", name="hook", size=1, min_median_lines=1)
    suite = load_suite(tmp_path / "suite")
    tok = train_tokenizer([FIXED, TESTS] * 20, 512, SplitPattern.KIMI)
    st = suite.tasks[0]
    task = dataclasses.replace(st.task, problem_statement=st.prompts["detailed"])
    n_prompt = len(encode_prompt(tok, initial_messages(task), list(TOOL_SPECS)))
    model = init_model(dataclasses.replace(tiny(), vocab_size=512), seed=0)
    cfg = dataclasses.replace(Config(), eval=EvalConfig(max_new_tokens=8, max_turns=2,
                                                        max_context=n_prompt + 64, concurrency=1))
    out = eval_resolved_rate(model, tok, cfg, num_tasks=1, suite=suite)
    # the RL trainer calls it again and again in one process: same (greedy) answer each time
    assert eval_resolved_rate(model, tok, cfg, num_tasks=1, suite=suite) == out
    assert out["eval_resolved_rate"] == 0.0 and out["eval_tasks"] == 1
    assert out["eval_suite_id"] == suite.suite_id
    assert 1 <= out["eval_generated_tokens"] <= 2 * 8 and out["eval_price"] > 0
