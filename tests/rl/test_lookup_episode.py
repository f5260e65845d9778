"""Lookup episodes (the token-level agent's one episode loop over the in-process notebook tools)
through the real protocol with a scripted engine (no model): exact records, the tools, the
structured claim and the behaviour terms in the reward; and the held-out summary with standard
errors."""
import types

import numpy as np
import pytest

from composer_jax.agent import lookup as lt
from composer_jax.agent.rollout import Rollout
from composer_jax.env import protocol
from composer_jax.rl.family_eval import summarize


class ScriptedEngine:
    """submit/wait/end_session; each turn returns the next scripted assistant text (+ <|im_end|>)
    as sampled tokens of version 3, and records what was fed."""

    def __init__(self, tok, texts, max_len=191):
        self.tok, self.texts, self.fed, self.ended = tok, list(texts), [], []
        self.cfg = types.SimpleNamespace(max_len=max_len)
        self.model_cfg = types.SimpleNamespace(vocab_size=lt.VOCAB_SIZE)

    def submit(self, ids, params, session=None):
        self.fed.append(list(ids))
        return len(self.fed) - 1

    def wait(self, rid, timeout=None):
        toks = self.tok.encode(self.texts[rid]) + [self.tok.token_to_id(protocol.IM_END)]
        n = len(toks)
        return types.SimpleNamespace(tokens=toks, logprobs=[-0.1] * n, raw_logprobs=[-0.1] * n,
                                     versions=[3] * n, router_indices=[],
                                     prompt_router_indices=None, prompt_router_start=0,
                                     finish_reason="stop_token")

    def end_session(self, session):
        self.ended.append(session)


def _call(name, args, i, content=""):
    return protocol.render_assistant(content, [(name, args)], i)


def _family(easy_weight=1.0):
    """The rl_async default's lookup family (the lookup model, env rewards, rl.seq_len 192)."""
    from composer_jax import registry
    from composer_jax.config import SECTION_PRESETS
    from composer_jax.overrides import apply_overrides
    from composer_jax.rl.tasks.lookup import LookupFamily
    cfg = apply_overrides(registry.get("rl_async").make_config(),
                          [f"rl.task.length_weights={easy_weight},0"], SECTION_PRESETS)
    return LookupFamily(cfg)


def _run(texts, task, weight=1.0):
    """An episode of `task` (an easy one: its length term scaled by `weight`)."""
    assert task.level == "easy"
    tok = lt.lookup_tokenizer()
    eng = ScriptedEngine(tok, texts)
    r = _family(weight).episode(eng, task, 1, greedy=False)
    return r, eng, tok


def test_an_optimal_episode_is_resolved_and_paid_the_communication_term():
    task = lt.make_tasks(1, 0, "eval")[0]
    r, eng, tok = _run([_call("read_file", {"target_file": task.key}, 0),
                        _call("finish", {"message": task.code, "success": True}, 1)], task)
    assert r.error is None and r.reward["resolved"] == 1.0
    assert r.reward["communication"] == 0.05 and r.reward["false_claim"] == 0.0
    assert r.info["num_calls"] == 2 and r.info["num_turns"] == 2 and r.info["reads"] == [task.key]
    assert len(eng.ended) == 1                                  # the episode's engine session
    # the tool result was fed back through the protocol: the second feed is the note's text
    assert tok.decode(eng.fed[1]).startswith("<|im_system|>tool<|im_middle|>## Return of "
                                             "functions.read_file:0\ncode " + task.code)
    seg = r.segments[0]
    assert seg.num_trainable == sum(len(tok.encode(t)) + 1 for t in eng.texts)
    assert set(seg.versions[seg.trainable].tolist()) == {3}
    assert 0 < r.reward["length"] < r.reward["base"]


def test_a_false_claim_is_penalised_and_an_honest_failure_is_not():
    task = lt.make_tasks(1, 0, "eval")[0]
    wrong = str((int(task.code) + 1) % 10)
    claimed, _, _ = _run([_call("finish", {"message": wrong, "success": True}, 0)], task)
    honest, _, _ = _run([_call("finish", {"message": wrong, "success": False}, 0)], task)
    assert claimed.reward["false_claim"] == 0.2 and honest.reward["false_claim"] == 0.0
    assert claimed.reward["resolved"] == honest.reward["resolved"] == 0.0
    assert claimed.total_reward < honest.total_reward


def test_invalid_calls_are_answered_and_counted():
    task = lt.make_tasks(1, 0, "train")[0]
    r, eng, tok = _run([_call("read_file", {"path": task.key}, 0), "I give up."], task)
    assert r.info["num_invalid_calls"] == 1 and r.info["stop_reason"] == "no_tool_call"
    assert "Error: read_file: missing required argument" in tok.decode(eng.fed[1])
    assert r.reward["invalid_calls"] == 0.05 and r.reward["resolved"] == 0.0


def test_length_term_scales_with_the_level_weight():
    task = lt.make_tasks(1, 0, "train")[0]
    texts = [_call("read_file", {"target_file": task.key}, 0, "Let me read it."),
             _call("finish", {"message": task.code, "success": True}, 1)]
    easy, _, _ = _run(texts, task, weight=1.0)
    hard, _, _ = _run(texts, task, weight=0.0)
    assert easy.reward["length"] > 0.2 and hard.reward["length"] == 0.0
    assert hard.total_reward - easy.total_reward == pytest.approx(easy.reward["length"])


def test_heldout_summary_has_standard_errors_and_checks_the_version():
    task = lt.make_tasks(1, 0, "eval")[0]
    good, _, _ = _run([_call("read_file", {"target_file": task.key}, 0),
                       _call("finish", {"message": task.code, "success": True}, 1)], task)
    bad = Rollout.failed(task.task_id, "", "boom", rollout_id="x")
    row = summarize([good, good, bad, bad], "heldout_lookup", 3)
    assert row["eval_resolved_rate"] == 0.5
    assert row["eval_resolved_se"] == pytest.approx(np.std([1, 1, 0, 0], ddof=1) / 2)
    assert row["heldout_lookup_resolved_rate"] == 0.5 and row["eval_easy_count"] == 2.0
    with pytest.raises(RuntimeError, match="sampled by versions"):
        summarize([good], "heldout_lookup", 4)
