"""Admission control, the rollout stream and the driver loop on the bandit program (in process,
thread workers; no model): numbers, not smoke."""
import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from composer_jax.errors import ConfigError  # noqa: E402
from composer_jax.rl.admission import AdmissionControl  # noqa: E402
from composer_jax.rl.driver import DriverSettings, run_rl, task_for_group  # noqa: E402
from composer_jax.rl.program import ProgramSpec  # noqa: E402
from composer_jax.rl.rollout import Rollout, SegmentBuilder  # noqa: E402
from composer_jax.rl.stream import RolloutLog, RolloutStream, StreamError  # noqa: E402
from rl_fake_program import MemoryStore  # noqa: E402


def test_admission_capacity_is_s_plus_v_plus_1_times_b():
    a = AdmissionControl(batch_groups=3, max_staleness=2)
    assert a.capacity == 9 and a.free() == 9
    for _ in range(9):
        a.start()
    assert not a.can_start()
    with pytest.raises(RuntimeError):
        a.start()
    a.advance(1)                       # one batch consumed -> exactly B more may start
    assert a.free() == 3
    sync = AdmissionControl(batch_groups=2, max_staleness=0)
    sync.start(), sync.start()
    assert not sync.can_start()        # S = 0: nothing starts before the batch is trained
    with pytest.raises(RuntimeError):
        a.advance(0)
    with pytest.raises(ConfigError):
        AdmissionControl(0, 1)


def _rollout(group, sample, reward=1.0):
    b = SegmentBuilder()
    b.feed([1, 2])
    b.sample([3], [-0.5], [-0.5], [0])
    b.end_turn("stop_token")
    return Rollout("t", group, [b.build()], {"total": reward}, rollout_id=f"{group}-s{sample:03d}")


def test_stream_logs_before_admitting_and_hands_out_complete_groups(tmp_path):
    log = RolloutLog(tmp_path)
    s = RolloutStream(log, group_size=2)
    s.open_group("g0000000", "t")
    s.open_group("g0000001", "t")
    s.put(_rollout("g0000001", 0))
    assert (tmp_path / "g0000001" / "g0000001-s000.rollout").exists()
    assert s.get_groups(1, timeout=0.05) is None            # no complete group yet
    s.put(_rollout("g0000001", 1, 0.0))
    s.put(_rollout("g0000000", 1))
    with pytest.raises(StreamError, match="already put"):
        s.put(_rollout("g0000000", 1))
    with pytest.raises(StreamError, match="not open"):
        s.put(_rollout("g0000009", 0))
    (g,) = s.get_groups(1, timeout=1)
    assert g.group_id == "g0000001" and [r.total_reward for r in g.ordered()] == [1.0, 0.0]
    assert s.missing("g0000000") == [0]
    assert sorted(r.rollout_id for r in log.scan()) == ["g0000000-s001", "g0000001-s000",
                                                        "g0000001-s001"]
    back = Rollout.load(tmp_path / "g0000001" / "g0000001-s001.rollout")
    assert back.bit_equal(g.ordered()[1])


def test_task_assignment_visits_every_task_once_per_epoch():
    tasks = [f"t{i}" for i in range(5)]
    first = [task_for_group(tasks, k, 3) for k in range(5)]
    second = [task_for_group(tasks, k, 3) for k in range(5, 10)]
    assert sorted(first) == tasks and sorted(second) == tasks
    assert first == [task_for_group(tasks, k, 3) for k in range(5)]     # deterministic


@pytest.mark.parametrize("staleness", [0, 2])
def test_driver_learns_and_bounds_staleness(tmp_path, staleness):
    spec = ProgramSpec("rl_fake_program:make", {"num_tasks": 6, "arms": 3, "env_s": 0.005,
                                                "crash_tasks": 1})
    s = run_rl(spec, tmp_path, DriverSettings(steps=12, group_size=4, batch_groups=2,
                                              max_staleness=staleness, num_workers=4,
                                              eval_every=6, progress=False), MemoryStore())
    assert s["version"] == 12 and s["rollouts_trained"] == 12 * 2 * 4
    hist = {int(k): v for k, v in s["staleness_hist"].items()}
    # S=0: every token was sampled by the version being trained (exactly synchronous); S=2: at
    # most S always (stragglers older than S are dropped at consumption, rl.stale_policy=drop)
    n = sum(hist.values())
    if staleness == 0:
        assert hist == {0: n}
    else:
        assert max(hist) <= staleness
        assert 1 in hist or 2 in hist                       # it did run ahead of the trainer
    assert s["error_rollouts"] >= 1                           # the crash task: error rollouts
    ev = s["eval"]
    assert ev["0"]["eval_resolved_rate"] <= 0.5 and ev["12"]["eval_resolved_rate"] == 1.0
    for version, row in ev.items():     # held-out episodes sampled with the version they are logged at
        assert row["eval_sampled_version_min"] == row["eval_sampled_version_max"] == int(version)
    import json
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "reward_mean" in r]
    assert len(train) == 12
    for key in ("reward_mean", "resolved_rate", "staleness_mean", "staleness_max",
                "weight_sync_bytes", "weight_sync_ratio", "rollouts_per_sec",
                "trainer_idle_frac"):
        assert key in train[0], key
    assert np.mean([r["reward_mean"] for r in train[-3:]]) > np.mean(
        [r["reward_mean"] for r in train[:3]]) + 0.2


@pytest.mark.parametrize("torn", ['{"group_id": "g0000001", "task', "{", "\x00\x00"])
def test_append_after_a_torn_last_line_keeps_the_next_line(tmp_path, torn):
    log = RolloutLog(tmp_path)
    log.append_admitted("g0000000", "t0", 0)
    with open(tmp_path / "admitted.jsonl", "a") as f:       # power loss mid-append
        f.write(torn)
    log.append_admitted("g0000001", "t1", 1)
    log.append_admitted("g0000002", "t2", 2)
    assert sorted(log.admitted()) == ["g0000000", "g0000001", "g0000002"]
    log.append_consumed(1, ["g0000000"], ["g0000000-s000"])
    with open(tmp_path / "consumed.jsonl", "a") as f:
        f.write(torn)
    log.append_consumed(2, ["g0000001"], ["g0000001-s000"])
    assert [r["version"] for r in log.consumed_rows()] == [1, 2]
    lines = (tmp_path / "admitted.jsonl").read_text().split("\n")
    assert lines[1] == torn and lines[-1] == ""           # the torn bytes stay on their own line


def test_checkpoint_evaluated_program_with_eval_tasks_finishes(tmp_path):
    """A program with its own held-out tasks scored by a checkpoint evaluator (eval_fn, as the
    lookup family is) ends after its last version (it used to wait for a program evaluation that
    was never scheduled)."""
    import threading
    spec = ProgramSpec("rl_fake_program:make", {"num_tasks": 4, "arms": 2, "num_eval": 2})
    out = {}

    def run():
        out["s"] = run_rl(spec, tmp_path, DriverSettings(steps=3, group_size=2, batch_groups=1,
                                                         eval_every=2, num_workers=2,
                                                         progress=False), MemoryStore(),
                          eval_fn=lambda model, v: {"score": float(v)})
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(120)
    assert not t.is_alive(), "the run did not end after its last version"
    assert out["s"]["version"] == 3 and sorted(out["s"]["eval"]) == ["0", "2", "3"]
    assert [out["s"]["eval"][k]["score"] for k in ("0", "2", "3")] == [0.0, 2.0, 3.0]
