"""The token-level agent: a real sandboxed oracle episode forced through the engine gives an exact
rollout (ids decode to what the environment saw, trainable = assistant tokens, behaviour log-probs
and routed experts reproduce the model's, bit-exact disk round trip); weight swaps show in the
per-token versions; truncated turns; self-summarization into several segments."""
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from composer_jax.config import tiny
from composer_jax.data import chat
from composer_jax.data import special_tokens as st
from composer_jax.data.config import SplitPattern
from composer_jax.data.tokenizer import train_tokenizer
from composer_jax.env import protocol as p
from composer_jax.env.agents import OracleAgent
from composer_jax.env.config import EnvConfig
from composer_jax.env.pythons import find_pythons
from composer_jax.env.sandbox import bwrap_works
from composer_jax.env.tasks.pool import TaskPool
from composer_jax.env.tasks.task import Task, unified_patch
from composer_jax.env.tools import TOOL_SPECS
from composer_jax.inference import Engine, EngineConfig
from composer_jax.rl.agent import AgentConfig, ScriptedPolicy, TokenAgent
from composer_jax.rl.rollout import END_EPISODE, END_SUMMARIZED, Rollout
from random_weights import random_params

pytestmark = pytest.mark.skipif(not bwrap_works(), reason="bubblewrap is not usable here")

GOOD = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
BAD = GOOD.replace("return a + b", "return a - b")
TESTS = ("import unittest\nimport mod\n\n\nclass T(unittest.TestCase):\n"
         "    def test_add(self):\n        self.assertEqual(mod.add(2, 3), 5)\n\n"
         "    def test_sub(self):\n        self.assertEqual(mod.sub(5, 3), 2)\n")
VOCAB = 768
MAX_LEN = 4096


def _init_model(cfg, seed):
    return random_params(cfg, seed)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    texts = [json.dumps(list(TOOL_SPECS))] * 3 + [p.SYSTEM_PROMPT, GOOD, TESTS] * 3
    tok = train_tokenizer(texts, VOCAB, SplitPattern.KIMI)
    model_cfg = dataclasses.replace(tiny(), vocab_size=VOCAB, mtp_depth=0)
    graphdef, state = _init_model(model_cfg, 0)
    version = sorted(find_pythons(), key=lambda v: tuple(map(int, v.split("."))))[-1]
    env_cfg = EnvConfig(python_versions=(version,), command_timeout_s=10.0, use_embeddings=False)
    pool = TaskPool(tmp_path_factory.mktemp("pool"))
    patch, n = unified_patch({"mod.py": BAD}, {"mod.py": GOOD})
    task = Task("t1", "bug", "train", version, "mod", "test_add fails; fix mod.py",
                ("test_mod.T.test_add",), ("test_mod.T.test_sub",), ("mod.py",),
                ("test_mod.py",), patch, n, version, version)
    pool.add(task, {"mod.py": BAD, "test_mod.py": TESTS}, {"mod.py": GOOD})
    return tok, graphdef, state, env_cfg, task, pool.task_dir("t1")


def _engine(graphdef, state, **kw):
    cfg = EngineConfig(max_batch=2, max_len=MAX_LEN, capture_router=True, **kw)
    return Engine(graphdef, state, cfg).start()


def _oracle_run(setup, engine, agent_cfg=AgentConfig(max_new_tokens=512), wrap=None):
    tok, _, _, env_cfg, task, d = setup
    policy = ScriptedPolicy(OracleAgent(task, d), tok,
                            summary=lambda msgs: "I fixed add in mod.py; tests still to run.")
    agent = TokenAgent(engine, tok, agent_cfg, env_cfg, wrap(policy) if wrap else policy)
    return agent.run(task, d, group_id="grp-1", rollout_id="r-1")


def _expected_text(messages, final_turn_closed=True):
    return st.BOS + p.render_prompt(messages, TOOL_SPECS, add_generation_prompt=False)


def test_oracle_episode_gives_an_exact_rollout(setup, tmp_path):
    tok, graphdef, state, env_cfg, task, d = setup
    engine = _engine(graphdef, state)
    try:
        r = _oracle_run(setup, engine)
    finally:
        engine.stop()
    assert r.error is None, r.error
    assert r.info["resolved"] and r.info["stop_reason"] == "finish"
    # what the grader saw is kept, so a verdict can be explained after the run
    assert r.info["secret_passed"] == r.info["secret_total"] and r.info["grade_detail"] == ""
    assert r.info["grade_s"] > 0
    assert r.total_reward > 0.5 and r.reward["resolved"] == 1.0
    assert (r.task_id, r.group_id, r.rollout_id) == ("t1", "grp-1", "r-1")
    assert len(r.segments) == 1 and r.segments[0].end_reason == END_EPISODE
    seg = r.segments[0]
    messages = r.info["messages"][0]
    # the assistant texts the environment parsed are exactly the oracle's script
    oracle = OracleAgent(task, d)
    script = [oracle([]) for _ in range(len(oracle.plan))]
    assert [m["raw"] for m in messages if m["role"] == "assistant"] == script
    # the ids decode to exactly the conversation the environment saw...
    assert tok.decode(seg.tokens) == _expected_text(messages)
    # ...and equal the whole-conversation encoding, with the same trainable mask
    ids, mask = chat.encode_messages(tok, messages, TOOL_SPECS)
    assert seg.tokens.tolist() == ids
    assert seg.trainable.astype(int).tolist() == mask
    # trainable = exactly the sampled spans of the turns (assistant bodies + their <|im_end|>)
    spans = np.zeros(len(seg), bool)
    for turn in seg.turns:
        spans[turn.sampled] = True
        assert seg.tokens[turn.sample_end - 1] == tok.token_to_id(p.IM_END)
        assert turn.finish_reason in ("forced", "stop_token") and not turn.truncated
    assert (spans == seg.trainable).all() and len(seg.turns) == len(script)
    tool_fed = [tok.decode(seg.tokens[t.fed]) for t in seg.turns[1:]]
    assert all(x.startswith("<|im_system|>tool<|im_middle|>## Return of") for x in tool_fed)
    # behaviour log-probs are the model's (temperature 1), and the routed experts replay them
    assert (seg.versions[seg.trainable] == 0).all() and (seg.versions[~seg.trainable] == -1).all()
    np.testing.assert_array_equal(seg.logprobs, seg.model_logprobs)
    router = seg.router_indices
    assert (router[:-1] >= 0).all() and (router[-1] == -1).all()
    replay = jnp.asarray(np.moveaxis(np.maximum(router, 0), 0, 1)[:, None])   # [Lm,1,T,K]
    model = nnx.merge(graphdef, state)
    logits = model(jnp.asarray(seg.tokens[None]), router_replay=replay, with_mtp=False).logits[0]
    logp = np.asarray(jax.nn.log_softmax(logits[:-1], axis=-1))
    pos = np.nonzero(seg.trainable)[0]
    np.testing.assert_allclose(logp[pos - 1, seg.tokens[pos]], seg.logprobs[pos], atol=2e-4)
    assert r.timing["generate_s"] > 0 and r.timing["grade_s"] > 0 and r.timing["start_time"] > 1e9
    # bit-exact round trip through disk
    path = r.save(tmp_path / "r.rollout")
    back = Rollout.load(path)
    assert back.to_bytes() == r.to_bytes()
    for name in ("tokens", "trainable", "logprobs", "model_logprobs", "versions", "router_indices"):
        assert getattr(back.segments[0], name).tobytes() == getattr(seg, name).tobytes()
    assert back.info == r.info and back.reward == r.reward and back.segments[0].turns == seg.turns


def test_weight_swap_mid_episode_shows_in_versions(setup):
    tok, graphdef, state, *_ = setup
    _, new_state = _init_model(dataclasses.replace(tiny(), vocab_size=VOCAB, mtp_depth=0), 1)
    engine = _engine(graphdef, state)

    def wrap(policy):
        def swapping(request):
            if request.turn_index == 1:     # between the first and second turn
                engine.swap_weights(new_state, version=5)
            return policy(request)
        return swapping

    try:
        r = _oracle_run(setup, engine, wrap=wrap)
    finally:
        engine.stop()
    assert r.error is None and r.info["resolved"]
    seg = r.segments[0]
    per_turn = [set(seg.versions[t.sampled].tolist()) for t in seg.turns]
    assert per_turn[0] == {0} and all(v == {5} for v in per_turn[1:])
    assert r.versions_used() == (0, 5)
    assert (seg.versions[~seg.trainable] == -1).all()


def test_truncated_turns_are_closed_by_a_fed_im_end(setup):
    tok, graphdef, state, env_cfg, task, d = setup
    engine = _engine(graphdef, state)
    agent = TokenAgent(engine, tok, AgentConfig(max_new_tokens=12, temperature=1.0),
                       dataclasses.replace(env_cfg, max_turns=3))
    try:
        r = agent.run(task, d, group_id="g")
    finally:
        engine.stop()
    assert r.error is None
    seg = r.segments[0]
    im_end = tok.token_to_id(p.IM_END)
    assert 1 <= len(seg.turns) <= 3
    for turn in seg.turns:
        assert turn.sample_end - turn.sample_start <= 12
        if turn.truncated:
            assert turn.finish_reason == "max_new_tokens" and turn.end == turn.sample_end + 1
            assert seg.tokens[turn.sample_end] == im_end and not seg.trainable[turn.sample_end]
    assert any(t.truncated for t in seg.turns)
    assert tok.decode(seg.tokens) == _expected_text(r.info["messages"][0])
    assert r.info["num_turns"] == len(seg.turns)


def test_context_overflow_self_summarizes_into_segments(setup):
    tok, graphdef, state, env_cfg, task, d = setup
    engine = _engine(graphdef, state)
    prompt_len = len(tok.encode(st.BOS + p.render_prompt(
        [{"role": "system", "content": p.SYSTEM_PROMPT},
         {"role": "user", "content": task.problem_statement}], TOOL_SPECS)))
    cfg = AgentConfig(max_new_tokens=256, summary_trigger_tokens=prompt_len + 400,
                      summary_max_tokens=64)
    try:
        r = _oracle_run(setup, engine, agent_cfg=cfg)
    finally:
        engine.stop()
    assert r.error is None and r.info["resolved"], r.error
    assert r.info["num_summaries"] >= 1 and len(r.segments) == r.info["num_summaries"] + 1
    assert [s.end_reason for s in r.segments] == [END_SUMMARIZED] * (len(r.segments) - 1) + [END_EPISODE]
    first, second = r.segments[0], r.segments[1]
    assert first.turns[-1].kind == "summary"
    summary_text = tok.decode(first.tokens[first.turns[-1].sampled])
    assert summary_text == "I fixed add in mod.py; tests still to run." + st.SUMMARY_END
    # each segment decodes to its own conversation; the next one restarts from system + task + summary
    for seg, msgs in zip(r.segments, r.info["messages"]):
        assert tok.decode(seg.tokens) == _expected_text(msgs)
    restart = r.info["messages"][1]
    assert [m["role"] for m in restart[:3]] == ["system", "user", "user"]
    assert st.SUMMARY_BEGIN + "I fixed add in mod.py; tests still to run." + st.SUMMARY_END \
        in restart[2]["content"]
    assert len(second) < len(first) + 400
    assert [w for _, w in r.samples()] == [r.total_reward] * len(r.segments)
    back = Rollout.from_bytes(r.to_bytes())
    assert back.to_bytes() == r.to_bytes() and len(back.segments) == len(r.segments)


def test_a_crashed_episode_becomes_an_error_rollout(setup):
    tok, graphdef, state, env_cfg, task, d = setup
    engine = _engine(graphdef, state)

    def wrap(policy):
        def crashing(request):
            if request.turn_index == 1:
                raise RuntimeError("policy server went away")
            return policy(request)
        return crashing

    try:
        r = _oracle_run(setup, engine, wrap=wrap)
    finally:
        engine.stop()
    assert r.error.startswith("RuntimeError: policy server went away")
    assert r.total_reward == 0.0 and r.reward == {"total": 0.0}
    assert len(r.segments) == 1 and r.segments[0].end_reason == "error"
    assert len(r.segments[0].turns) == 1 and r.segments[0].num_trainable > 0
    assert not engine._sessions                     # the episode's session was ended
    assert Rollout.from_bytes(r.to_bytes()).to_bytes() == r.to_bytes()
