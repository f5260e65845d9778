"""Outcome classes of coding episodes (held-out rows of the coding ladder) and the evaluator's row."""
from __future__ import annotations

from composer_jax.agent.rollout import Rollout
from composer_jax.rl.batch_metrics import OUTCOMES, outcome_class, outcome_metrics
from composer_jax.rl.evaluators import EvaluatorService
from composer_jax.rl.jobs import EVAL, Job


def _ep(resolved=0.0, changed=(), stop="finish", tampering=0.0, calls=3, invalid=0):
    return Rollout("t", "g", [], {"total": resolved, "resolved": resolved, "tampering": tampering},
                   info={"changed_files": list(changed), "stop_reason": stop, "num_calls": calls,
                         "num_invalid_calls": invalid, "num_turns": calls, "generated_tokens": 50})


def test_outcome_classes_cover_what_an_episode_came_to():
    assert outcome_class(_ep(1.0, ["m.py"])) == "resolved"
    assert outcome_class(_ep()) == "finish_no_edit"
    assert outcome_class(_ep(changed=["m.py"])) == "finish_wrong_edit"
    assert outcome_class(_ep(changed=["m.py"], stop="max_turns")) == "no_finish_edited"
    assert outcome_class(_ep(stop="max_turns")) == "no_finish_no_edit"
    assert outcome_class(Rollout.failed("t", "g", "boom")) == "error"
    assert outcome_class(Rollout("t", "g", [], {"total": 1.0}, info={"num_calls": 2})) is None
    m = outcome_metrics([_ep(1.0, ["m.py"]), _ep(), _ep(), _ep(tampering=1.0, changed=["x"])], "eval_")
    assert m["eval_outcome_resolved"] == 1 and m["eval_outcome_finish_no_edit"] == 2
    assert m["eval_outcome_finish_wrong_edit"] == 1 and m["eval_tampered"] == 1
    assert sum(m[f"eval_outcome_{c}"] for c in OUTCOMES) == 4
    assert outcome_metrics([Rollout("t", "g", [], {"total": 0.0}, info={})]) == {}


def test_evaluator_row_has_outcomes_valid_calls_and_se():
    rows = []
    ev = EvaluatorService(["a", "b", "c", "d"], 5, lambda v, row: rows.append((v, row)))
    eps = [_ep(1.0, ["m.py"]), _ep(), _ep(calls=4, invalid=2), _ep(1.0, ["m.py"])]
    for job, ep in zip(ev.jobs(5, 0), eps):
        assert job.kind == EVAL
        ev.record(job, ep)
    (v, row), = rows
    assert v == 5 and row["eval_resolved_rate"] == 0.5
    assert abs(row["eval_resolved_se"] - 0.5 / 2 * (4 / 3) ** 0.5) < 1e-9   # std(ddof=1) / sqrt(n)
    assert row["eval_outcome_finish_no_edit"] == 2 and row["eval_tampered"] == 0
    assert row["eval_valid_call_rate"] == 11 / 13 and row["eval_turns_mean"] == 3.25
