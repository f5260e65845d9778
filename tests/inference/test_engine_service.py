"""The engine as a service: a background driver, futures, cancellation, pruning, teacher forcing,
non-blocking submit/swap during a device step, and many threads sharing one engine."""
import concurrent.futures
import dataclasses
import threading
import time

import jax.numpy as jnp
import numpy as np
import pytest

from composer_jax.inference import Engine, SamplingParams
from composer_jax.protocol.requests import EngineStoppedError
from composer_jax.inference.sampling import processed_logprobs

from inference_testlib import ENGINE

SP = SamplingParams(temperature=1.0, max_new_tokens=6)


def _engine(split, **kw):
    return Engine(*split, dataclasses.replace(ENGINE, **kw))


def _conversation(eng, i, submit):
    """Two turns of session i with seeded sampling; returns the completions."""
    sp = dataclasses.replace(SP, seed=100 + i)
    first = submit(eng, [3 + i, 17, 40 + i], sp, f"s{i}")
    second = submit(eng, [9, i + 1], dataclasses.replace(sp, seed=200 + i), f"s{i}")
    return first, second


def test_32_threads_share_one_engine_and_match_step_driven(split):
    n = 32
    ref = _engine(split)
    step_driven = [_conversation(ref, i, lambda e, p, sp, s: e.wait(e.submit(p, sp, session=s)))
                   for i in range(n)]
    eng = _engine(split, max_queue=64).start()
    try:
        with concurrent.futures.ThreadPoolExecutor(n) as pool:
            results = list(pool.map(
                lambda i: _conversation(eng, i, lambda e, p, sp, s: e.request(p, sp, s).result(60)),
                range(n)))
    finally:
        eng.stop()
    assert not eng.running
    for (a1, a2), (b1, b2) in zip(step_driven, results):
        assert b1.tokens == a1.tokens and b2.tokens == a2.tokens
        np.testing.assert_allclose(b2.raw_logprobs, a2.raw_logprobs, atol=1e-4)
        assert b2.finish_reason == "max_new_tokens"
    # 4 slots, 32 sessions: batches were shared and idle sessions evicted/rebuilt
    assert eng.stats["decode_steps"] < 2 * n * SP.max_new_tokens / 2


def test_submit_swap_cancel_do_not_wait_for_a_device_step(split):
    eng = _engine(split)
    entered, release = threading.Event(), threading.Event()
    real = eng._decode_fn

    def slow_decode(*args):
        entered.set()
        assert release.wait(30)
        return real(*args)

    eng._decode_fn = slow_decode
    eng.start()
    try:
        fut = eng.request([5, 6, 7], dataclasses.replace(SP, max_new_tokens=4, seed=1))
        assert entered.wait(30)                     # the driver is inside a device step now
        t0 = time.monotonic()
        other = eng.request([8, 9], dataclasses.replace(SP, max_new_tokens=2, seed=2))
        eng.swap_weights(eng.state, version=7)
        late = eng.submit([1, 2], SP)
        assert eng.cancel(late)
        assert time.monotonic() - t0 < 1.0
        assert eng.future(late).result(1).finish_reason == "cancelled"
        assert not fut.done()
        release.set()
        c = fut.result(30)
        assert c.versions[0] == 0 and c.versions[-1] == 7 and len(c.tokens) == 4
        assert other.result(30).versions == [7, 7]
    finally:
        release.set()
        eng.stop()


def test_cancel_running_request_keeps_session_usable(split):
    eng = _engine(split)
    rid = eng.submit([4, 5, 6], dataclasses.replace(SP, max_new_tokens=40, seed=3), session="c")
    for _ in range(3):
        eng.step()
    assert eng.cancel(rid)
    assert not eng.cancel(10_000)
    eng.step()
    c = eng.wait(rid)
    assert c.finish_reason == "cancelled" and len(c.tokens) == 4
    assert rid not in eng.completions                       # wait() collected it
    nxt = eng.wait(eng.submit([7], dataclasses.replace(SP, seed=4), session="c"))
    assert len(nxt.tokens) == SP.max_new_tokens
    fresh = eng.wait(eng.submit([4, 5, 6] + c.tokens + [7], dataclasses.replace(SP, seed=4)))
    assert nxt.tokens == fresh.tokens
    eng.end_session("c")                    # the name now starts a new, empty conversation
    again = eng.wait(eng.submit([7], dataclasses.replace(SP, seed=4), session="c"))
    alone = eng.wait(eng.submit([7], dataclasses.replace(SP, seed=4)))
    assert again.tokens == alone.tokens


def test_finished_requests_are_pruned(split):
    eng = _engine(split, max_finished=3)
    ids = [eng.submit([i + 1, 2], dataclasses.replace(SP, max_new_tokens=2)) for i in range(5)]
    eng.run()
    assert sorted(eng.completions) == ids[2:]
    with pytest.raises(KeyError, match="pruned"):
        eng.future(ids[0])


def test_forced_tokens_record_real_logprobs(split, full_logits):
    eng = _engine(split)
    prompt, forced = [11, 12, 13], (40, 41, 42, 43, 44)
    sp = SamplingParams(temperature=0.8, top_k=50, max_new_tokens=16, forced_tokens=forced)
    c = eng.wait(eng.submit(prompt, sp))
    assert tuple(c.tokens) == forced and c.finish_reason == "forced"
    logits = full_logits(split[1], prompt + list(forced))[len(prompt) - 1:-1]
    proc = np.asarray(processed_logprobs(jnp.asarray(logits), jnp.full(5, 0.8), jnp.full(5, 50),
                                         jnp.full(5, 1.0)))
    np.testing.assert_allclose(c.logprobs, proc[np.arange(5), list(forced)], atol=1e-5)
    short = eng.wait(eng.submit(prompt, dataclasses.replace(sp, max_new_tokens=2)))
    assert short.tokens == [40, 41] and short.finish_reason == "max_new_tokens"


def test_driver_crash_fails_waiters(split):
    eng = _engine(split)

    def boom(*args):
        raise RuntimeError("device lost")

    eng._decode_fn = boom
    eng.start()
    fut = eng.request([1, 2, 3], SP)
    with pytest.raises(EngineStoppedError, match="device lost"):
        fut.result(30)
    with pytest.raises(EngineStoppedError):
        eng.submit([1], SP)
    eng.stop()
