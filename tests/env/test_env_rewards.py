import math

import pytest

from composer_jax.env.config import EnvConfig
from composer_jax.env.rewards import (EffortCounts, claims_success, compute_reward, effort,
                                      length_penalty)


def test_length_penalty_values():
    assert length_penalty(0, 0.01, 2.0) == 0.0
    # q = 2: C(x) = x / (1 + k x)
    assert length_penalty(100, 0.01, 2.0) == pytest.approx(50.0)
    # q = 1 limit: ln(1 + k x) / k, and continuity around it
    assert length_penalty(100, 0.01, 1.0) == pytest.approx(math.log(2) / 0.01)
    assert length_penalty(100, 0.01, 1.0 + 1e-6) == pytest.approx(length_penalty(100, 0.01, 1.0), rel=1e-4)
    # q = 0: linear
    assert length_penalty(100, 0.01, 0.0) == pytest.approx(100.0)
    # concave and increasing
    xs = [0, 10, 20, 30]
    c = [length_penalty(x, 0.05, 1.5) for x in xs]
    assert c[1] - c[0] > c[2] - c[1] > c[3] - c[2] > 0


def _reward(cfg, **kw):
    base = dict(resolved=False, f2p_fraction=0.0, num_calls=3, num_invalid_calls=0, num_tokens=300,
                num_turns=3, changed_files=["m.py"], editable_files=("m.py",), final_message="")
    base.update(kw)
    return compute_reward(cfg=cfg, **base)


def test_components_and_total():
    cfg = EnvConfig(reward_partial_credit=0.5)
    r = _reward(cfg, resolved=True)
    assert r.base == 1.0 and r.resolved == 1.0
    x = cfg.reward_length_token_weight * 300 + 3 * cfg.reward_length_call_weight + 3
    assert r.length == pytest.approx(cfg.reward_length_coef * length_penalty(x, 0.01, 2.0))
    assert r.valid_calls == pytest.approx(cfg.reward_valid_call)      # resolved, 3 of 3 valid
    assert r.total == pytest.approx(1.0 + r.valid_calls - r.length)
    p = _reward(cfg, f2p_fraction=0.5)
    assert p.base == 0.25
    assert set(r.as_dict()) == {"reward_resolved", "reward_base", "reward_invalid_calls",
                                "reward_length", "reward_outside_edits", "reward_false_claim",
                                "reward_total", "reward_tampering", "reward_valid_calls",
                                "reward_communication", "reward_effort"}


def test_invalid_call_never_pays_better_than_valid():
    cfg = EnvConfig()
    for resolved in (False, True):
        valid = _reward(cfg, resolved=resolved, num_calls=4)
        invalid = _reward(cfg, resolved=resolved, num_calls=4, num_invalid_calls=1)
        assert invalid.total < valid.total
    many = _reward(cfg, num_calls=100, num_invalid_calls=100)
    assert many.invalid_calls == cfg.reward_invalid_call_cap
    # exhaustively: turning any one valid call into an invalid one never raises the total
    # (resolved, partially resolved or not, small or large valid-use weight, below and at the cap)
    for c in (cfg, EnvConfig(reward_valid_call=0.5, reward_partial_credit=0.5)):
        for resolved, frac in ((True, 1.0), (False, 0.5), (False, 0.0)):
            for calls in range(0, 30):
                for bad in range(0, calls):
                    kw = dict(resolved=resolved, f2p_fraction=frac, num_calls=calls)
                    more_bad = _reward(c, num_invalid_calls=bad + 1, **kw)
                    assert more_bad.total <= _reward(c, num_invalid_calls=bad, **kw).total
    # valid use pays accuracy in proportion to success: nothing for an unresolved episode, the
    # same for 1 or 100 valid calls
    assert _reward(cfg, num_calls=5).valid_calls == 0.0
    assert _reward(cfg, resolved=True, num_calls=100).valid_calls == cfg.reward_valid_call
    assert _reward(cfg, resolved=True, num_calls=4, num_invalid_calls=1).valid_calls == \
        pytest.approx(0.75 * cfg.reward_valid_call)


def test_effort_from_real_token_counts():
    cfg = EnvConfig(reward_length_token_weight=0.01, reward_length_tool_call_token_weight=0.02,
                    reward_length_tool_output_weight=0.003, reward_length_final_weight=0.05,
                    reward_length_call_weight=0.5, reward_length_turn_weight=0.25)
    counts = EffortCounts(content_tokens=100, tool_call_tokens=50, tool_output_tokens=1000,
                          final_message_tokens=20)
    x = effort(cfg, num_calls=4, num_turns=3, counts=counts)
    assert x == pytest.approx(0.01 * 100 + 0.02 * 50 + 0.003 * 1000 + 0.05 * 20 + 0.5 * 4 + 0.25 * 3)
    assert counts.generated_tokens == 170
    r = _reward(cfg, resolved=True, num_calls=4, num_turns=3, counts=counts)
    assert r.effort == pytest.approx(x)
    assert r.length == pytest.approx(cfg.reward_length_coef * length_penalty(x, 0.01, 2.0))
    # without counts the total generated-token count is used (old behaviour)
    r0 = _reward(cfg, num_calls=4, num_turns=3, num_tokens=170)
    assert r0.effort == pytest.approx(0.01 * 170 + 0.5 * 4 + 0.25 * 3)
    # more tool output -> more effort -> a larger (concave) penalty
    more = _reward(cfg, num_calls=4, num_turns=3, counts=EffortCounts(100, 50, 5000, 20))
    assert more.length > r.length


def test_communication_term():
    cfg = EnvConfig(reward_communication=0.1, reward_communication_max_tokens=10)
    short = _reward(cfg, resolved=True, final_message="Fixed the off-by-one in m.py.")
    assert short.communication == 0.1 and short.false_claim == 0.0
    assert short.total == pytest.approx(1.0 + short.valid_calls + 0.1 - short.length)
    assert _reward(cfg, resolved=True, final_message="").communication == 0.0
    assert _reward(cfg, resolved=True, final_message="I am unsure this works").communication == 0.0
    long = "Fixed. " + "Details follow. " * 20
    assert _reward(cfg, resolved=True, final_message=long).communication == 0.0
    assert _reward(cfg, resolved=True, final_message=long,
                   counts=EffortCounts(final_message_tokens=8)).communication == 0.1
    # unresolved: a success claim costs, a clear message never pays
    claim = _reward(cfg, final_message="Fixed the off-by-one in m.py.")
    assert claim.communication == 0.0 and claim.false_claim == cfg.reward_false_claim


def test_outside_edits_and_false_claims():
    cfg = EnvConfig()
    assert _reward(cfg, changed_files=["m.py", "test_m.py"]).outside_edits == cfg.reward_outside_edit
    assert _reward(cfg, final_message="Fixed, all tests pass.").false_claim == cfg.reward_false_claim
    assert _reward(cfg, resolved=True, final_message="Fixed.").false_claim == 0.0
    assert _reward(cfg, final_message="I could not fix it.").false_claim == 0.0
    assert claims_success("Done - the bug is fixed") and not claims_success("tests still fail")
