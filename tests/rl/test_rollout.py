"""The Rollout record: validation, bit-exact disk round trip, corruption detection, no JAX."""
import subprocess
import sys

import numpy as np
import pytest

from composer_jax.rl.rollout import (END_ERROR, END_SUMMARIZED, NO_EXPERT, Rollout,
                                     RolloutFormatError, Segment, SegmentBuilder)


def _segment(seed=0, router=True, end=END_SUMMARIZED):
    rng = np.random.default_rng(seed)
    b = SegmentBuilder()
    b.feed([1, 5, 6, 7])
    b.set_router(0, rng.integers(0, 8, (3, 2, 2)))
    b.sample([11, 12, 13], rng.normal(size=3).astype(np.float32),
             [-np.inf, np.float32(-1e-30), -0.5], [3, 3, 4])
    b.feed([7])                                  # closing token appended by the agent
    b.end_turn("max_new_tokens", num_tool_calls=1, truncated=True)
    b.feed([20, 21])
    b.sample([30], [np.nan], [-2.0], [4])
    if router:
        b.set_router(3, rng.integers(0, 8, (6, 2, 2)))
    b.end_turn("stop_token")
    return b.build(end)


def _rollout():
    return Rollout("task/1", "grp-7", [_segment(0), _segment(1, end="episode")],
                   {"total": 0.75, "base": 1.0, "length": 0.25}, rollout_id="r1",
                   timing={"start_time": 1.7e9 + 0.123456789, "generate_s": 2.5},
                   info={"stop_reason": "finish", "turns": [1, 2]})


def test_builder_layout_and_turn_spans():
    s = _segment()
    assert s.tokens.tolist() == [1, 5, 6, 7, 11, 12, 13, 7, 20, 21, 30]
    assert s.trainable.tolist() == [False] * 4 + [True] * 3 + [False] * 3 + [True]
    assert s.versions.tolist() == [-1] * 4 + [3, 3, 4] + [-1] * 3 + [4]
    assert s.logprobs[~s.trainable].tolist() == [0.0] * 7
    t0, t1 = s.turns
    assert (t0.fed_start, t0.sample_start, t0.sample_end, t0.end) == (0, 4, 7, 8)
    assert (t1.fed_start, t1.sample_start, t1.sample_end, t1.end) == (8, 10, 11, 11)
    assert s.tokens[t1.fed].tolist() == [20, 21] and t0.truncated
    assert s.router_indices.shape == (11, 2, 2)
    assert (s.router_indices[9:] == NO_EXPERT).all() and (s.router_indices[:9] >= 0).all()


def test_round_trip_is_bit_exact(tmp_path):
    r = _rollout()
    path = r.save(tmp_path / "sub" / "r1.rollout")
    back = Rollout.load(path)
    assert back.to_bytes() == r.to_bytes() == path.read_bytes()
    assert back.bit_equal(r)
    for a, b in zip(r.segments, back.segments):
        for name in ("tokens", "trainable", "logprobs", "model_logprobs", "versions",
                     "router_indices"):
            x, y = getattr(a, name), getattr(b, name)
            assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
        assert a.turns == b.turns and a.end_reason == b.end_reason
    assert np.isnan(back.segments[0].logprobs[-1])
    assert back.segments[0].model_logprobs[4] == -np.inf
    assert back.timing == r.timing and back.info == r.info and back.reward == r.reward
    assert back.total_reward == 0.75 and back.versions_used() == (3, 4)
    assert [w for _, w in back.samples()] == [0.75, 0.75]
    assert not list(tmp_path.glob("sub/.*.tmp"))        # the temp file was renamed away


def test_router_free_and_error_rollouts_round_trip():
    seg = _segment(router=False)
    assert seg.router_indices is not None                # rows were set for the first turn
    b = SegmentBuilder()
    b.feed([1, 2])
    b.sample([3], [-0.1], [-0.2], [0])
    b.end_turn("stop_token")
    bare = b.build()
    assert bare.router_indices is None
    err = Rollout.failed("t", "g", "sandbox crashed: Traceback ...", [bare])
    assert err.total_reward == 0.0 and err.segments[-1].end_reason == END_ERROR
    back = Rollout.from_bytes(err.to_bytes())
    assert back.error == err.error and back.segments[0].router_indices is None
    assert back.to_bytes() == err.to_bytes()


def test_invalid_records_are_rejected():
    with pytest.raises(RolloutFormatError, match="total"):
        Rollout("t", "g", [], {"base": 1.0})
    with pytest.raises(RolloutFormatError, match="error rollout"):
        Rollout("t", "g", [], {"total": 1.0}, error="boom")
    with pytest.raises(RolloutFormatError, match="one value per token"):
        Segment([1, 2], [False, True], [0, 0], [0, 0], [-1])
    with pytest.raises(RolloutFormatError, match="no policy version"):
        Segment([1, 2], [False, True], [0, -1], [0, -1], [-1, -1])
    with pytest.raises(RolloutFormatError, match="version -1 and logprob 0"):
        Segment([1, 2], [False, True], [0.5, -1], [0, -1], [-1, 0])
    data = bytearray(_rollout().to_bytes())
    data[100] ^= 1
    with pytest.raises(RolloutFormatError, match="checksum"):
        Rollout.from_bytes(bytes(data))
    with pytest.raises(RolloutFormatError, match="truncated|checksum"):
        Rollout.from_bytes(bytes(data[:-5]))
    with pytest.raises(RolloutFormatError, match="magic"):
        Rollout.from_bytes(b"x" * 100)


def test_rollout_module_does_not_import_jax():
    code = ("import sys, composer_jax.rl.rollout, composer_jax.rl; "
            "assert 'jax' not in sys.modules, 'jax imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
