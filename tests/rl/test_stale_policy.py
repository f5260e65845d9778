"""Staleness bounded at consumption (rl.stale_policy) and error rollouts penalised, not dropped:
the trainer service's group selection, the admission release and make_batch's error rows."""
import numpy as np
import pytest

from composer_jax.rl.admission import AdmissionControl
from composer_jax.rl.batch import make_batch
from composer_jax.agent.rollout import Rollout, SegmentBuilder
from composer_jax.rl.batch_metrics import error_metrics, group_staleness
from composer_jax.rl.trainer import TrainerService, TrainerStart
from composer_jax.rl.stream import RolloutLog, RolloutStream


def _rollout(group, sample, version, reward=1.0, error=None):
    b = SegmentBuilder()
    b.feed([1, 2])
    b.sample([3, 4], [-0.5, -0.5], [-0.5, -0.5], [version, version + 1])
    b.end_turn("stop_token")
    if error is not None:
        return Rollout.failed("t", group, error, [b.build()], rollout_id=f"{group}-s{sample:03d}")
    return Rollout("t", group, [b.build()], {"total": reward}, rollout_id=f"{group}-s{sample:03d}")


class _Recorder:
    def __init__(self):
        self.steps = []

    def step(self, state, groups):
        self.steps.append([g[0].group_id for g in groups])
        return state, {"loss": 0.0}

    def weights(self, state):
        return {}


class _Store:
    def publish(self, version, params):
        return {"bytes_sent": 1, "full_bytes": 1}


def _trainer(tmp_path, policy, version, rows):
    log = RolloutLog(tmp_path / "rollouts")
    stream = RolloutStream(log, group_size=2)
    # groups sampled by versions 0 (5 behind at version 5), 3 and 4 (2 and 1 behind)
    for gid, v in (("g0000000", 0), ("g0000001", 3), ("g0000002", 4)):
        stream.open_group(gid, "t")
        stream.put(_rollout(gid, 0, v))
        stream.put(_rollout(gid, 1, v))
    learner = _Recorder()
    t = TrainerService(learner, stream, _Store(), log, _Hooks(rows),
                       TrainerStart({}, version, frozenset()), batch_groups=2,
                       total_steps=version + 1, checkpoint_every=100, max_staleness=2,
                       stale_policy=policy)
    return t, learner, log


class _Hooks:                      # the run's side of the trainer (rl.trainer.TrainerHooks)
    def __init__(self, rows):
        self.rows = rows

    def checkpoint(self, version, state, consumed_groups):
        pass

    def log_metrics(self, version, row):
        self.rows.append(row)

    def rollouts_per_sec(self):
        return 0.0

    def on_version(self, version, state):
        pass


def test_drop_policy_sets_aside_groups_older_than_the_bound(tmp_path):
    rows = []
    t, learner, log = _trainer(tmp_path, "drop", 5, rows)
    t._one_step()
    assert learner.steps == [["g0000001", "g0000002"]]      # the version-0 group was replaced
    (row,) = rows
    assert row["staleness_max"] == 2.0 and row["stale_dropped_groups"] == 1.0
    assert row["stale_dropped_rollouts"] == 2.0 and row["stale_kept_rollouts"] == 0.0
    assert t.progress.dropped_groups == 1
    assert "g0000000" in t.progress.consumed_groups          # never re-opened on resume
    (consumed,) = log.consumed_rows()
    assert sorted(consumed["groups"]) == ["g0000000", "g0000001", "g0000002"]


def test_keep_policy_trains_stale_groups_and_counts_them(tmp_path):
    rows = []
    t, learner, _ = _trainer(tmp_path, "keep", 5, rows)
    t._one_step()
    assert learner.steps == [["g0000000", "g0000001"]]
    assert rows[0]["staleness_max"] == 5.0 and rows[0]["stale_kept_rollouts"] == 2.0
    assert rows[0]["stale_dropped_groups"] == 0.0


def test_group_staleness_is_the_oldest_token():
    g = [_rollout("g", 0, 3), _rollout("g", 1, 1)]
    assert group_staleness(g, 6) == 5
    assert group_staleness([Rollout.failed("t", "g", "boom", rollout_id="g-s000")], 6) == -1


def test_admission_release_frees_the_slots_of_dropped_groups():
    a = AdmissionControl(batch_groups=2, max_staleness=1)
    for _ in range(4):
        a.start()
    assert not a.can_start()
    a.release_to(1)                  # one started group was dropped at consumption
    assert a.can_start() and a.free() == 1 and a.active == 3
    with pytest.raises(RuntimeError):
        a.release_to(0)


def test_error_rollouts_with_tokens_are_trained_with_the_penalty():
    ok = _rollout("g", 0, 0, reward=1.0)
    crashed = _rollout("g", 1, 0, error="RuntimeError: tool crashed")
    empty = Rollout.failed("t", "g", "sandbox died", rollout_id="g-s002")
    b = make_batch([ok, crashed, empty], seq_len=8, router_replay=False, error_reward=-1.0)
    assert b["rewards"].tolist() == [1.0, -1.0]              # the crash is trained, penalised
    assert error_metrics([ok, crashed, empty], 1.0) == {"error_penalised": 1.0,
                                                       "error_excluded": 1.0}
    old = make_batch([ok, crashed, empty], seq_len=8, router_replay=False)
    assert old["rewards"].tolist() == [1.0]                  # error_reward=None: left out
    assert error_metrics([ok, crashed], None) == {"error_penalised": 0.0, "error_excluded": 1.0}
    np.testing.assert_array_equal(b["sample_weight"], [1.0, 1.0])


@pytest.mark.parametrize("policy", ["drop", "keep"])
def test_latency_model_run_bounds_staleness_in_every_row(tmp_path, policy):
    """A driver run whose episodes take heavy-tailed sandbox times (rl/latency_model.py: max/median
    ~37) has stragglers older than S; with rl.stale_policy=drop every metrics row has
    staleness_max <= S (they are dropped and counted), with keep they are trained beyond S."""
    import json
    import pathlib
    import sys
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from composer_jax.rl.driver import DriverSettings, run_rl
    from composer_jax.rl.program import ProgramSpec
    from rl_fake_program import MemoryStore
    spec = ProgramSpec("rl_fake_program:make", {"num_tasks": 6, "arms": 3, "latency_scale": 0.02})
    s = run_rl(spec, tmp_path, DriverSettings(steps=30, group_size=2, batch_groups=1,
                                              max_staleness=1, stale_policy=policy, num_workers=4,
                                              progress=False), MemoryStore())
    assert s["version"] == 30
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "staleness_max" in r]
    assert len(train) == 30
    worst = max(r["staleness_max"] for r in train)
    dropped = sum(r["stale_dropped_groups"] for r in train)
    kept = sum(r["stale_kept_rollouts"] for r in train)
    if policy == "drop":
        assert worst <= 1 and dropped >= 1 and kept == 0, (worst, dropped, kept)
    else:
        assert worst > 1 and kept >= 1 and dropped == 0, (worst, kept)
