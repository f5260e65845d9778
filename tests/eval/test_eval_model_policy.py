"""Model policies run on the engine service with RL's token-level agent: the oracle's script forced
through the engine scores exactly as the text-loop oracle does (real token counts, prompt cache
accounting), and K sampled episodes per task run concurrently with per-sample seeds, so a rerun
reproduces them."""
import dataclasses
import json

import pytest
from flax import nnx

from composer_jax.config import tiny
from random_weights import random_params
from composer_jax.data.config import SplitPattern
from composer_jax.data.tokenizer import train_tokenizer
from composer_jax.env import protocol
from composer_jax.env.agents import OracleAgent
from composer_jax.env.config import EnvConfig
from composer_jax.env.sandbox import bwrap_works
from composer_jax.env.tools import TOOL_SPECS
from composer_jax.eval.policies import ModelPolicy, ReferencePolicy
from composer_jax.eval.runner import RunSettings, run_suite
from composer_jax.eval.suite import build_suite, load_suite
from eval_helpers import FIXED, TESTS, make_pool, make_task

pytestmark = pytest.mark.skipif(not bwrap_works(), reason="bubblewrap is not usable here")
VOCAB = 768


def random_model(cfg, seed=0):
    """A model with random weights (see tests/random_weights.py)."""
    return nnx.merge(*random_params(cfg, seed))


def small_tokenizer():
    texts = [json.dumps(list(TOOL_SPECS))] * 3 + [protocol.SYSTEM_PROMPT, FIXED, TESTS] * 3
    return train_tokenizer(texts, VOCAB, SplitPattern.KIMI)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("evalmodel")
    make_pool(root / "pool", [make_task()])
    build_suite(root / "pool", root / "suite", name="mini", size=1, min_median_lines=1)
    model = random_model(dataclasses.replace(tiny(), vocab_size=VOCAB, mtp_depth=0))
    return load_suite(root / "suite"), small_tokenizer(), model


def _settings(samples):
    return RunSettings(samples=samples, styles=("detailed",), concurrency=2,
                       price_prompt_per_mtok=1.0, price_cached_per_mtok=0.1,
                       price_generated_per_mtok=10.0)


def test_model_episodes_on_the_engine_service(setup):
    suite, tok, model = setup
    env = EnvConfig(max_turns=8)
    oracle_text = run_suite(suite, ReferencePolicy("oracle"), env, _settings(1), progress=False)
    forced = ModelPolicy("forced-oracle", model, tok, max_new_tokens=512, temperature=0.0,
                         max_context=4096, concurrency=2, seed=0,
                         scripted=lambda task, task_dir: OracleAgent(task, task_dir))
    try:
        recs = run_suite(suite, forced, env, _settings(2), progress=False)
        stats = dict(forced.engine.stats)
        sampler = ModelPolicy("sampled", None, tok, max_new_tokens=6, temperature=1.0,
                              max_context=4096, concurrency=2, seed=0, engine=forced.engine)
        sampled = run_suite(suite, sampler, EnvConfig(max_turns=2), _settings(2), progress=False)
        sampler.close()
        assert forced.engine.running            # a borrowed engine is left running
    finally:
        forced.close()
    assert not forced.engine.running
    ref = oracle_text[0]
    for r in recs:
        assert r["resolved"] and r["partial"] == 1.0 and r["regressions"] == 0 and not r["crashed"]
        for key in ("tool_calls", "turns", "diff_lines", "tests_run_before_finish", "finished",
                    "test_edits", "out_of_scope_files", "claims_success", "invalid_calls"):
            assert r[key] == ref[key], key
        # real token counts: every turn bills its whole context as prompt; the session's cache
        # holds all of it but the newly fed tokens
        assert r["generated_tokens"] > 0 and 0 < r["cached_prompt_tokens"] < r["prompt_tokens"]
        fresh = r["prompt_tokens"] - r["cached_prompt_tokens"]
        assert r["price"] == pytest.approx((fresh + 0.1 * r["cached_prompt_tokens"]
                                            + 10.0 * r["generated_tokens"]) / 1e6)
    assert recs[0]["generated_tokens"] == recs[1]["generated_tokens"]
    assert stats["generated_tokens"] == 2 * recs[0]["generated_tokens"]
    # the K=2 samples ran at once: batched decode steps advanced both sessions. Run one after the
    # other, every generated token but each turn's first (sampled at prefill) costs a decode step;
    # how much overlaps depends on the sandboxes' tool-call timing (under CI load 202 steps for
    # 336 tokens, alone about half), so the bound is "some steps were shared".
    turns = sum(r["turns"] for r in recs)
    assert stats["decode_steps"] < stats["generated_tokens"] - turns
    # sampled: honest numbers for a random model
    for r in sampled:
        assert not r["resolved"] and 1 <= r["turns"] <= 2 and r["prompt_tokens"] > 100
        assert 1 <= r["generated_tokens"] <= 2 * 6 and r["partial"] == 0.0


@pytest.mark.slow
def test_sampled_episodes_are_reproducible(setup):
    """Each (task, sample, turn) has its own PRNG seed: a rerun, scheduled differently, samples
    the same tokens."""
    suite, tok, model = setup
    policy = ModelPolicy("sampled", model, tok, max_new_tokens=6, temperature=1.0,
                         max_context=4096, concurrency=2, seed=0)
    try:
        runs = [run_suite(suite, policy, EnvConfig(max_turns=2), _settings(2), progress=False)
                for _ in range(2)]
    finally:
        policy.close()
    keys = ("generated_tokens", "prompt_tokens", "stop_reason", "turns", "tool_calls")
    assert [[r[k] for k in keys] for r in runs[0]] == [[r[k] for k in keys] for r in runs[1]]
