"""Turn-level episode checkpoints and resume (`agent.episode_checkpoint`).

- a multi-turn lookup episode (the rl_async default family: its SFT policy on the real engine,
  process workers) whose worker is SIGKILLed right after its first turn's checkpoint finishes on
  another worker from turn 1, its record says `resumed_at_turns == [1]`, and every token, behaviour
  log-prob, version and router row equals an uninterrupted run's with the same weights and seed;
- the same on a scripted engine in process (the checkpoint's state round trip: tool transcript,
  counters, reward), and an engine failure mid-episode resumes in place (`run_job`).

The lookup family stands in for coding here: a coding episode on this 2-core CI machine takes
minutes (a 3072-token context through the engine per turn), a lookup episode about a second.
The real-engine SIGKILL test is `slow` (run with -m slow); CI runs the same SIGKILL on process
workers against a history-determined policy server (`_HistoryServer`) and the in-process tests.
"""
import os
import signal
import time

import numpy as np
import pytest

from composer_jax.agent.episode_checkpoint import EpisodeCheckpoint

FIELDS = ("tokens", "trainable", "logprobs", "model_logprobs", "versions", "router_indices")


def _same_tokens(a, b, logprob_atol=0.0):
    """Every per-token field equal (log-probs within `logprob_atol`), same turns and reward."""
    assert len(a.segments) == len(b.segments)
    for sa, sb in zip(a.segments, b.segments):
        for f in FIELDS:
            x, y = getattr(sa, f), getattr(sb, f)
            assert (x is None) == (y is None), f
            if x is None:
                continue
            assert x.shape == y.shape, f
            if logprob_atol and f in ("logprobs", "model_logprobs"):
                np.testing.assert_allclose(x, y, rtol=0, atol=logprob_atol, err_msg=f)
            else:
                assert np.array_equal(x, y), f
        assert sa.turns == sb.turns
    if logprob_atol:
        assert a.reward.keys() == b.reward.keys()
        assert all(abs(a.reward[k] - b.reward[k]) < 1e-6 for k in a.reward)
    else:
        assert a.reward == b.reward


def _result(pool, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pool.results(1.0)
        if got:
            assert len(got) == 1
            return got[0]
    raise AssertionError("no result from the pool")


def _kill_and_resume(pool, job, kills):
    """Runs `job` with the kill hook armed, then the dead worker's job it gives back."""
    kills[:] = ["armed"]
    pool.submit(job)
    back, none = _result(pool)
    assert none is None and len(kills) == 1 and kills[0] != "armed"   # the worker died
    assert back.attempt == 1 and EpisodeCheckpoint.from_bytes(back.resume).turn == 1
    assert pool.resumed == 1 and pool.tokens_saved > 0
    pool.submit(back)                      # what the driver does with a dead worker's job
    _, res = _result(pool)
    assert res.error is None, res.error
    assert res.info["resumed_at_turns"] == [1] and res.info["worker_deaths"] == 1
    assert res.info["resumed_by"] == ["worker_died"]
    return res


@pytest.mark.slow            # 60-100 s on 2 loaded cores (engine start, worker processes, 4 episodes)
def test_sigkilled_worker_resumes_from_last_turn(tmp_path):
    """Both resume modes on one engine: `prefill` (the default: tokens, versions and router rows
    equal, log-probs of the resumed turns within fp32 rounding) and `replay` (bit-exact)."""
    import dataclasses

    from composer_jax import registry
    from composer_jax.rl.backend_local import ProcessPool
    from composer_jax.rl.jobs import Job
    from composer_jax.rl.program import build_program
    from composer_jax.rl.task_program import task_program_spec
    cfg = registry.get("rl_async").make_config()
    spec = task_program_spec(cfg)
    replay_spec = task_program_spec(dataclasses.replace(
        cfg, rl=dataclasses.replace(cfg.rl, resume_mode="replay")))
    program = build_program(spec)
    server = program.make_policy()          # the SFT policy, weights fixed for every run
    server.engine.swap_weights(server.engine.state, 0)      # as version 0 (sampled tokens need one)
    server.version = 0
    kills = []

    def kill_after_first_turn(rid, data, pid):
        if kills == ["armed"] and EpisodeCheckpoint.from_bytes(data).turn == 1:
            os.kill(pid, signal.SIGKILL)
            kills[:] = [pid]

    try:
        pool = ProcessPool(spec, server, 2, checkpoints=tmp_path / "ckpt",
                           on_checkpoint=kill_after_first_turn)
        try:
            tasks = program.train_tasks()
            for i in range(6):                 # an episode of two turns or more
                job = Job("group-000000", i, tasks[i], 1000 + i)
                pool.submit(job)
                _, ref = _result(pool)
                if ref.error is None and ref.info["num_turns"] >= 2:
                    break
            assert ref.error is None and ref.info["num_turns"] >= 2, ref.info
            assert "resumed_at_turns" not in ref.info
            res = _kill_and_resume(pool, job, kills)
        finally:
            pool.close()
        pool = ProcessPool(replay_spec, server, 1, checkpoints=tmp_path / "ckpt2",
                           on_checkpoint=kill_after_first_turn)
        try:
            exact = _kill_and_resume(pool, job, kills)
        finally:
            pool.close()
    finally:
        server.close()
    assert res.info["num_turns"] == exact.info["num_turns"] == ref.info["num_turns"]
    _same_tokens(exact, ref)                                   # replay: every bit
    _same_tokens(res, ref, logprob_atol=1e-5)                  # prefill: tokens, fp32-close lps
    first = ref.segments[0].turns[0]
    for r in (res, exact):
        assert r.info["resumed_tokens_saved"] == [first.sample_end - first.sample_start]
        prefix = slice(0, first.end)                           # the checkpointed turn: as recorded
        assert np.array_equal(r.segments[0].logprobs[prefix], ref.segments[0].logprobs[prefix])
    assert not any((tmp_path / "ckpt").iterdir())             # finished episodes drop theirs


# ---------------------------------------------------------------------- scripted engine

class _Engine:
    """A scripted engine: turn i samples texts[i] (+ <|im_end|>) with distinct log-probs;
    `fail_at`: the request indices whose wait raises (the engine died)."""

    def __init__(self, tok, texts, fail_at=()):
        import types
        from composer_jax.agent import lookup as lk
        self.tok, self.texts, self.fail_at = tok, list(texts), set(fail_at)
        self.fed, self.sessions, self.ended = [], [], []
        self.cfg = types.SimpleNamespace(max_len=191)
        self.model_cfg = types.SimpleNamespace(vocab_size=lk.VOCAB_SIZE)
        self.turn = 0

    def submit(self, ids, params, session=None):
        self.fed.append(list(ids))
        self.sessions.append(session)
        return len(self.fed) - 1

    def wait(self, rid, timeout=None):
        import types
        from composer_jax.agent.episode_checkpoint import EngineUnavailable
        from composer_jax.env import protocol
        if rid in self.fail_at:
            self.fail_at.discard(rid)
            raise EngineUnavailable("the engine died")
        turn = params_turn = self.turn
        self.turn += 1
        toks = self.tok.encode(self.texts[params_turn]) + [self.tok.token_to_id(protocol.IM_END)]
        n = len(toks)
        lp = [-0.01 * (turn + 1) * (k + 1) for k in range(n)]
        return types.SimpleNamespace(tokens=toks, logprobs=lp, raw_logprobs=lp,
                                     versions=[turn] * n, router_indices=[],
                                     prompt_router_indices=None, prompt_router_start=0,
                                     finish_reason="stop_token")

    def end_session(self, session):
        self.ended.append(session)


def _lookup_family():
    from composer_jax import registry
    from composer_jax.rl.tasks.lookup import LookupFamily
    return LookupFamily(registry.get("rl_async").make_config())


def _texts(task):
    from composer_jax.env import protocol
    return [protocol.render_assistant("", [("read_file", {"target_file": task.key})], 0),
            protocol.render_assistant("", [("read_file", {"target_file": task.key})], 1),
            protocol.render_assistant("", [("finish", {"message": task.code, "success": True})],
                                      2)]


def test_checkpoint_round_trip_resumes_exactly():
    from composer_jax.agent import lookup as lk
    fam = _lookup_family()
    task = lk.make_tasks(1, 0, "train")[0]
    tok = fam.tokenizer()
    ref = fam.episode(_Engine(tok, _texts(task)), task, 7, greedy=False)
    cks = []
    fam.episode(_Engine(tok, _texts(task)), task, 7, greedy=False,
                checkpoint=lambda ck: cks.append(ck.to_bytes()))
    assert [EpisodeCheckpoint.from_bytes(c).turn for c in cks] == [1, 2]
    ck = EpisodeCheckpoint.from_bytes(cks[0])
    assert ck.state["workspace"]["state"]["reads"] == [task.key]
    eng = _Engine(tok, _texts(task))
    eng.turn = 1
    res = fam.episode(eng, task, 7, greedy=False, resume=ck)
    assert res.error is None and res.reward["resolved"] == 1.0
    _same_tokens(res, ref)
    assert res.info["resumed_at_turns"] == [1] and res.info["reads"] == ref.info["reads"]
    assert res.info["num_calls"] == 3 and res.info["num_turns"] == 3
    # the resumed session was fed the whole recorded prefix, then the new tool result
    prefix = ck.segments[-1].tokens.tolist()
    assert eng.fed[0][:len(prefix)] == prefix and len(eng.fed[0]) > len(prefix)
    assert eng.sessions[0].endswith(".r1") and eng.ended[0] == ck.state["seg"]["session"]


def test_engine_failure_resumes_in_place():
    from composer_jax.agent import lookup as lk
    from composer_jax.rl.jobs import Job, run_job
    fam = _lookup_family()
    task = lk.make_tasks(1, 0, "train")[0]
    tok = fam.tokenizer()
    ref = fam.episode(_Engine(tok, _texts(task)), task, 7, greedy=False)
    eng = _Engine(tok, _texts(task), fail_at=(2, 3))   # turn 3's request, twice: after 2 turns

    class Program:
        resumable = True

        def run_episode(self, task_id, seed, policy, *, greedy, checkpoint=None, resume=None):
            return fam.episode(eng, task, seed, greedy=greedy, checkpoint=checkpoint,
                               resume=resume)
    saved = []
    r = run_job(Program(), Job("g", 0, task.task_id, 7), None, "w",
                save=lambda rid, data: saved.append(rid))
    assert r.error is None and r.info["interruptions"] == 2
    assert r.info["interrupted_by"] == ["EngineUnavailable"] * 2
    # turns 1 and 2, then each resume on record (a second resume from turn 2 keeps the first)
    assert r.info["resumed_at_turns"] == [2, 2] and saved == ["g-s000"] * 4
    assert r.info["resumed_by"] == ["EngineUnavailable"] * 2
    _same_tokens(r, ref)


def test_sandbox_workspace_state_is_a_diff_that_restores(tmp_path):
    """A coding workspace checkpoints as its changed files against the snapshot (edits, new
    files in new folders, deletions) and a fresh workspace of the same snapshot restores them."""
    import json

    from composer_jax.agent.episode_checkpoint import restore_workspace, workspace_state
    from composer_jax.env.workspace import open_workspace
    snap = tmp_path / "snapshot"
    (snap / "pkg").mkdir(parents=True)
    (snap / "pkg" / "a.py").write_text("x = 1\n")
    (snap / "pkg" / "gone.py").write_text("y = 2\n")
    (snap / "README").write_text("unchanged\n")
    with open_workspace(snap) as ws:
        (ws.root / "pkg" / "a.py").write_text("x = 3\n")
        (ws.root / "pkg" / "gone.py").unlink()
        (ws.root / "new" / "deep").mkdir(parents=True)
        (ws.root / "new" / "deep" / "b.py").write_bytes(b"\x00binary\xff")
        ws.num_calls, ws.num_invalid_calls = 5, 1
        state = json.loads(json.dumps(workspace_state(ws)))     # JSON, as in the record
        before = ws.changed_files()
    assert sorted(state["files"]) == before == ["new/deep/b.py", "pkg/a.py", "pkg/gone.py"]
    assert state["files"]["pkg/gone.py"] is None and "README" not in state["files"]
    with open_workspace(snap) as ws2:
        restore_workspace(ws2, state)
        assert ws2.changed_files() == before
        assert (ws2.root / "pkg" / "a.py").read_text() == "x = 3\n"
        assert (ws2.root / "new" / "deep" / "b.py").read_bytes() == b"\x00binary\xff"
        assert not (ws2.root / "pkg" / "gone.py").exists()
        assert (ws2.num_calls, ws2.num_invalid_calls) == (5, 1)
        out = ws2.run_command("cat pkg/a.py && echo ok > new/deep/c.txt && cat new/deep/c.txt")
        assert "x = 3" in out.output and "ok" in out.output   # the sandbox sees and can write them


# ---------------------------------------------------------------------- process workers, CI

class _HistoryServer:
    """A policy server (rpc: submit/wait/end_session) whose reply is a function of the session's
    whole token history, like a model: turn k of a lookup episode (k = tool results seen) gets
    `texts[k]`, with log-probs hashed from the history. A resumed session fed the recorded prefix
    therefore answers exactly as the uninterrupted one."""

    def __init__(self, tok, texts):
        from composer_jax.env import protocol
        self.tok, self.texts = tok, texts
        self.im_end = tok.token_to_id(protocol.IM_END)
        self.marker = tok.token_to_id("<|im_system|>")
        self.hist, self.reqs = {}, []

    def rpc(self, method, args, kwargs):
        return getattr(self, method)(*args, **kwargs)

    def submit(self, ids, params, session=None):
        self.hist.setdefault(session, []).extend(ids)
        self.reqs.append(session)
        return len(self.reqs) - 1

    def wait(self, rid, timeout=None):
        import hashlib
        h = self.hist[self.reqs[rid]]
        turn = h.count(self.marker) - 1             # the system prompt, then one per tool result
        toks = self.tok.encode(self.texts[turn]) + [self.im_end]
        seed = hashlib.sha256(np.asarray(h, np.int64).tobytes()).digest()
        lp = [-(b + 1) / 256 for b in seed[:len(toks)]] + [-0.5] * max(0, len(toks) - 32)
        h.extend(toks)
        return {"tokens": toks, "logprobs": lp, "raw_logprobs": lp, "versions": [2] * len(toks),
                "router_indices": [], "prompt_router_indices": None, "prompt_router_start": 0,
                "finish_reason": "stop_token"}

    def end_session(self, session):
        self.hist.pop(session, None)


def test_sigkilled_process_worker_resumes_on_another(tmp_path):
    """CI version of the slow test: a three-turn lookup episode on process workers; the worker is
    SIGKILLed right after turn 1's checkpoint; the episode finishes on a fresh worker from turn 1
    with every token and log-prob of the uninterrupted run."""
    from composer_jax import registry
    from composer_jax.rl.backend_local import ProcessPool
    from composer_jax.rl.jobs import Job
    from composer_jax.rl.program import build_program
    from composer_jax.rl.task_program import task_program_spec
    spec = task_program_spec(registry.get("rl_async").make_config())
    program = build_program(spec)
    task_id = program.train_tasks()[0]
    task = program.family.task(task_id)
    server = _HistoryServer(program.family.tokenizer(), _texts(task))
    kills = []

    def kill_after_first_turn(rid, data, pid):
        if kills == ["armed"] and EpisodeCheckpoint.from_bytes(data).turn == 1:
            os.kill(pid, signal.SIGKILL)
            kills[:] = [pid]

    pool = ProcessPool(spec, server, 2, checkpoints=tmp_path / "ckpt",
                       on_checkpoint=kill_after_first_turn)
    try:
        job = Job("group-000000", 0, task_id, 5)
        pool.submit(job)
        _, ref = _result(pool)
        assert ref.error is None and ref.info["num_turns"] == 3 and ref.reward["resolved"] == 1.0
        res = _kill_and_resume(pool, job, kills)
        assert kills[0] not in pool.worker_pids() and pool.restarts == 1   # it ran elsewhere
    finally:
        pool.close()
    _same_tokens(res, ref)
    first = ref.segments[0].turns[0]
    assert res.info["resumed_tokens_saved"] == [first.sample_end - first.sample_start]
    assert res.info["reads"] == ref.info["reads"] == [task.key, task.key]
