"""Runs that show their health (`rl/health.py`, `rl/plots.py`, `rl/baseline.py`): warnings when
held-out falls below version 0 or valid calls collapse, plots whose axes show negatives and keep
one scale per panel, and a stop during version 0's evaluation that keeps the baseline."""
import json
import os
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from composer_jax.rl.driver import DriverSettings, run_rl  # noqa: E402
from composer_jax.rl.health import HealthMonitor, health_warnings  # noqa: E402
from composer_jax.rl.program import ProgramSpec  # noqa: E402
from composer_jax.rl.run_report import end_summary  # noqa: E402
from rl_fake_program import MemoryStore  # noqa: E402


def _rows(valid, evals, reward=None):
    rows = [{"step": v + 1, "reward_mean": (reward or {}).get(v + 1, 0.5),
             "valid_call_rate": x} for v, x in enumerate(valid)]
    rows += [{"step": v, "eval_resolved_rate": r, "eval_resolved_se": 0.03}
             for v, r in evals.items()]
    return rows


def test_warnings_name_the_versions_and_the_numbers():
    healthy = _rows([0.9] * 12, {0: 0.37, 10: 0.45})
    assert health_warnings(healthy) == []
    sick = _rows([0.9] * 5 + [0.5] * 2 + [0.06] * 5, {0: 0.367, 10: 0.30, 20: 0.52, 30: 0.02})
    w = health_warnings(sick)
    assert w == ["warning: held-out 0.020 at version 30 is below version 0's 0.367 (versions "
                 "below version 0: 10, 30)",
                 "warning: valid calls collapsed: valid_call_rate 0.06 at versions 8-12 (was "
                 "0.90 at versions 1-5)"]


def test_monitor_warns_once_per_event():
    mon = HealthMonitor()
    said = []
    for r in _rows([0.9] * 5 + [0.1] * 8, {0: 0.4, 5: 0.3, 10: 0.35}):
        said += mon.check(r["step"], {k: v for k, v in r.items() if k != "step"})
    assert len([s for s in said if "valid calls collapsed" in s]) == 1
    assert [s.split(" is below")[0] for s in said if "held-out" in s] == [
        "warning: held-out 0.300 at version 5", "warning: held-out 0.350 at version 10"]


def test_end_summary_carries_the_warnings(tmp_path):
    rows = _rows([0.9] * 12, {0: 0.5, 10: 0.1})
    summary = {"version": 12, "steps": 12, "rollouts_finished": 10, "elapsed_s": 5.0,
               "rollouts_per_sec": 2.0, "eval": {"0": rows[-2], "10": rows[-1]}}
    text = end_summary("rl_async", summary, tmp_path, rows)
    assert text.splitlines()[-1] == ("  warning: held-out 0.100 at version 10 is below version "
                                     "0's 0.500 (versions below version 0: 10)")


def test_end_summary_rate_keeps_slow_runs_readable(tmp_path):
    """A coding run makes well under one rollout per second; the end line must not round it to 0."""
    heads = [end_summary("rl_async", {"version": 6, "steps": 6, "rollouts_finished": 48,
                                      "elapsed_s": 122.0, "rollouts_per_sec": r}, tmp_path, []
                         ).splitlines()[0] for r in (48 / 122, 9.5, 117.3)]
    assert [h.rsplit("(", 1)[1] for h in heads] == ["0.39 rollouts/s)", "9.5 rollouts/s)",
                                                    "117 rollouts/s)"]


def test_plots_show_negative_rewards_and_one_scale_per_panel(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from composer_jax.rl import plots
    rows = _rows([0.9] * 10, {0: 0.4, 10: 0.2}, reward={v: -0.3 for v in range(5, 11)})
    for r in rows:
        if "reward_mean" in r:
            r.update(entropy=1.5, is_weight_mean=1.0, is_weight_max=40.0, tool_calls_mean=2.0,
                     invalid_calls_mean=0.1, turns_mean=2.0, reward_effort_mean=45.0)
    captured = {}
    real_save = plots._save

    def grab(fig, path):
        captured[path.name] = [(ax.get_ylim(), [ln.get_label() for ln in ax.get_lines()])
                               for ax in fig.axes]
        return real_save(fig, path)
    plots._save = grab
    try:
        (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        plots.write_plots(tmp_path, {"staleness_hist": {"0": 3}})
    finally:
        plots._save = real_save
        plt.close("all")
    (lo, hi), _ = captured["reward.png"][0]
    assert lo < -0.3 and hi > 0.5                       # the negative reward is on the plot
    health = captured["health.png"]
    assert len(health) == 6                               # entropy, KL, valid, IS mean, IS max, held-out
    assert health[4][0][1] > 40 and health[3][0][1] < 5   # IS max has its own scale
    beh = captured["behaviour.png"]
    counts = [ax for ax in beh if "turns_mean" in ax[1]][0]
    assert "reward_effort_mean" not in counts[1] and counts[0][1] < 10   # 45 not on the ~2 axis
    assert (tmp_path / "plots" / "health.png").exists()


def test_stop_during_version_0_evaluation_keeps_the_baseline(tmp_path):
    spec = ProgramSpec("rl_fake_program:make", {"num_tasks": 4, "arms": 2, "num_eval": 2})
    stop = threading.Event()
    stop.signal_name = "SIGINT"

    def slow_eval(model, v):
        stop.set()                       # Ctrl-C arrives while version 0 is being evaluated
        time.sleep(1.0)
        return {"eval_resolved_rate": 0.25 + v}
    s = run_rl(spec, tmp_path, DriverSettings(steps=4, group_size=2, batch_groups=1,
                                              eval_every=2, num_workers=2, progress=False),
               MemoryStore(), stop_event=stop, eval_fn=slow_eval)
    assert s["stopped_by"] == "SIGINT" and s["eval"]["0"]["eval_resolved_rate"] == 0.25


def test_resume_evaluates_a_lost_baseline_again(tmp_path):
    spec = ProgramSpec("rl_fake_program:make", {"num_tasks": 4, "arms": 2, "num_eval": 2})
    settings = DriverSettings(steps=2, group_size=2, batch_groups=1, eval_every=2,
                              num_workers=2, progress=False)
    run_rl(spec, tmp_path, settings, MemoryStore(), eval_fn=lambda m, v: {"eval_resolved_rate": 0.5})
    # as if killed during version 0's evaluation: its row is gone, checkpoints 0 and 2 are there
    path = tmp_path / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows
                            if not (r["step"] == 0 and "eval_resolved_rate" in r)))
    s = run_rl(spec, tmp_path, DriverSettings(**{**settings.__dict__, "steps": 4}), MemoryStore(),
               eval_fn=lambda m, v: {"eval_resolved_rate": 0.125 if v == 0 else 0.5})
    assert s["eval"]["0"]["eval_resolved_rate"] == 0.125
