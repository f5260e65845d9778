"""rl.task=coding through the real pieces: sandboxed episodes of a one-task pool by the token-level
agent against the engine service (over the policy-client interface), environment grading and
rewards, rl_step, the weight store, and the checkpoint evaluator hook. Short: a tiny random policy
(it never makes a valid tool call), 2 versions of 1 group x 2 samples.

The slow version (`-m slow`) runs `launch.py --experiment=rl_async --set rl.task=coding` end to end
with the cached SFT policy and the eval suite's runner."""
import dataclasses
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from composer_jax.config import CodingTaskConfig, Config, JobConfig, RLConfig, tiny
from composer_jax.data.config import SplitPattern
from composer_jax.data.tokenizer import train_tokenizer
from composer_jax.env import protocol as p
from composer_jax.env.config import EnvConfig
from composer_jax.env.pythons import find_pythons
from composer_jax.env.sandbox import bwrap_works
from composer_jax.env.tasks.pool import TaskPool
from composer_jax.env.tasks.task import Task, unified_patch
from composer_jax.env.tools import TOOL_SPECS
from composer_jax.rl.driver import DriverSettings, run_rl
from composer_jax.rl.task_program import task_program_spec

pytestmark = pytest.mark.skipif(not bwrap_works(), reason="bubblewrap is not usable here")

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
GOOD = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
BAD = GOOD.replace("return a + b", "return a - b")
TESTS = ("import unittest\nimport mod\n\n\nclass T(unittest.TestCase):\n"
         "    def test_add(self):\n        self.assertEqual(mod.add(2, 3), 5)\n\n"
         "    def test_sub(self):\n        self.assertEqual(mod.sub(5, 3), 2)\n")


def _setup(tmp: pathlib.Path):
    tok = train_tokenizer([json.dumps(list(TOOL_SPECS))] * 3 + [p.SYSTEM_PROMPT, GOOD, TESTS] * 3,
                          512, SplitPattern.KIMI)
    tok.save(tmp / "tokenizer.json")
    version = sorted(find_pythons(), key=lambda v: tuple(map(int, v.split("."))))[-1]
    pool = TaskPool(tmp / "pool")
    patch, n = unified_patch({"mod.py": BAD}, {"mod.py": GOOD})
    pool.add(Task("t1", "bug", "train", version, "mod", "test_add fails; fix mod.py",
                  ("test_mod.T.test_add",), ("test_mod.T.test_sub",), ("mod.py",),
                  ("test_mod.py",), patch, n, version, version),
             {"mod.py": BAD, "test_mod.py": TESTS}, {"mod.py": GOOD})
    model = dataclasses.replace(tiny(), vocab_size=512, mtp_depth=0)
    rl = RLConfig(group_size=2, batch_groups=1, max_staleness=1, steps=2,
                  job=JobConfig(num_rollout_workers=2, checkpoint_every=1, eval_every=2),
                  task=CodingTaskConfig(num_train_tasks=4, tokenizer=str(tmp / "tokenizer.json")),
                  max_new_tokens=12, seq_len=2048, loss_normalizer=64.0)
    env = EnvConfig(python_versions=(version,), command_timeout_s=10.0, use_embeddings=False,
                    max_turns=2, pool_dir=str(tmp / "pool"))
    cfg = dataclasses.replace(Config(), model=model, rl=rl, env=env)
    return cfg, task_program_spec(cfg)


def test_coding_rl_runs_sandboxed_episodes_and_the_checkpoint_evaluator(tmp_path):
    from experiments.rl import make_store
    cfg, spec = _setup(tmp_path)
    seen = {}

    def eval_fn(model, version):              # the eval suite's runner stands here
        import jax
        from flax import nnx
        leaves = [np.asarray(x, np.float64) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]
        seen[version] = sum(float(np.abs(x).sum()) for x in leaves)
        return {"eval_resolved_rate": 0.0, "eval_tasks": 1, "eval_suite_id": "fake"}

    s = DriverSettings(group_size=2, batch_groups=1, max_staleness=1, steps=2, checkpoint_every=1,
                       eval_every=2, num_workers=2, progress=False)
    summary = run_rl(spec, tmp_path / "run", s, make_store(cfg), eval_fn=eval_fn)
    assert summary["version"] == 2 and summary["rollouts_trained"] == 4
    assert summary["error_rollouts"] == 0
    # versions 0 and 2 were scored, on different weights (the trainer's, copied at that version)
    assert sorted(seen) == [0, 2] and seen[0] != seen[2]
    assert summary["eval"]["2"]["eval_source"] == 2.0
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "reward_mean" in r]
    assert len(train) == 2
    for r in train:      # behaviour terms from env.rewards, per version
        for k in ("tool_calls_mean", "invalid_calls_mean", "turns_mean", "generated_tokens_mean",
                  "reward_length_mean", "reward_effort_mean", "reward_invalid_calls_mean",
                  "resolved_rate", "loss"):
            assert k in r and np.isfinite(r[k]), k
        assert r["reward_effort_mean"] > 0 and r["turns_mean"] >= 1
    # every rollout is a real sandboxed, graded episode recorded token by token
    from composer_jax.rl.rollout import Rollout
    files = sorted((tmp_path / "run" / "rollouts").glob("*/*.rollout"))
    assert len(files) == 4
    r = Rollout.load(files[0])
    assert r.info["p2p_total"] == 1 and r.info["f2p_total"] == 1 and not r.info["resolved"]
    assert r.timing["grade_s"] > 0 and r.segments[0].trainable.sum() > 0
    assert "length" in r.reward and r.reward["total"] <= 0


@pytest.mark.slow
def test_rl_async_coding_end_to_end(tmp_path):
    """The CLI path: pool and SFT policy (cached), RL on sandboxed episodes, the eval suite's
    runner at versions 0 and the last."""
    cmd = [sys.executable, str(ROOT / "launch.py"), "--experiment=rl_async",
           f"--workdir={tmp_path}", "--set", "rl.task=coding", "--set", "rl.steps=4",
           "--set", "rl.job.eval_every=4", "--set", "rl.task.num_eval_tasks=1"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]
    s = json.loads((tmp_path / "rl_summary.json").read_text())
    assert s["version"] == 4 and set(s["eval"]) == {"0", "4"}
    assert all("eval_resolved_rate" in v for v in s["eval"].values())
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert sum("tool_calls_mean" in r for r in rows) == 4


def test_coding_run_summary_thirds_and_standard_errors(tmp_path):
    """benchmarks/rl_coding_summary.py: episodes assigned to versions by the consumed log, first
    vs last third means with standard errors over episodes, the pooled valid-call rate."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from rl_coding_summary import mean_se, summarise, valid_rate_se

    from composer_jax.rl.rollout import Rollout
    rdir = tmp_path / "rollouts"
    consumed = []
    # 6 versions x 2 episodes; versions 1-2: invalid calls only, versions 5-6: valid and resolved
    for v in range(1, 7):
        ids = []
        for s in range(2):
            good = v >= 5
            gid = f"g{v:07d}"
            r = Rollout("t", gid, [], {"total": 1.0 if good else -0.1, "resolved": float(good),
                                       "effort": 3.0 if good else 5.0 + s},
                        rollout_id=f"{gid}-s{s:03d}",
                        info={"num_calls": 2, "num_invalid_calls": 0 if good else 2 - s,
                              "num_turns": 2, "generated_tokens": 10})
            r.save(rdir / gid / f"{gid}-s{s:03d}.rollout")
            ids.append(f"{gid}-s{s:03d}")
        consumed.append({"version": v, "groups": [f"g{v:07d}"], "rollout_ids": ids})
    (rdir / "consumed.jsonl").write_text("".join(json.dumps(c) + "\n" for c in consumed))
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval_resolved_rate": 0.5,
                                                        "eval_tasks": 2}) + "\n")
    text, stats = summarise(tmp_path)
    q = stats["quantities"]
    assert stats["first_versions"] == [1, 2] and stats["last_versions"] == [5, 6]
    # first third: invalid calls 2,1,2,1 of 2 calls each -> valid rate 2/8; last: 8/8
    assert q["valid_call_rate"]["first"] == pytest.approx(0.25) and q["valid_call_rate"]["last"] == 1.0
    assert q["invalid_calls"]["first"] == pytest.approx(1.5)
    assert q["invalid_calls"]["first_se"] == pytest.approx(np.std([2, 1, 2, 1], ddof=1) / 2)
    assert q["reward_effort"]["diff"] == pytest.approx(3.0 - 5.5) and "rewarded way" in text
    assert q["resolved"]["last"] == 1.0 and stats["eval"] == {0: 0.5}
    assert mean_se([1.0, 3.0]) == (2.0, pytest.approx(1.0))
    rate, se = valid_rate_se([2, 2, 0], [1, 2, 0])
    assert rate == pytest.approx(0.75) and 0 < se < 0.5
