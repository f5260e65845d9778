"""cpt_rl_sweep (issue 30): correlation statistics, the per-cell readers, cell selection, the
config sections, the stdlib completion family, and a 2 budgets x 1 seed sweep end to end."""
import dataclasses
import json
import math

import numpy as np
import pytest

from composer_jax.config import SweepConfig
from composer_jax.errors import ConfigError
from composer_jax.sweep import cells, report, stats


def test_pearson_spearman_match_numpy_and_ranks():
    x, y = [1.0, 2.0, 3.0, 4.0, 5.0], [2.0, 1.0, 4.0, 3.0, 10.0]
    assert stats.pearson(x, y) == pytest.approx(np.corrcoef(x, y)[0, 1], abs=1e-12)
    assert stats.spearman(x, y) == pytest.approx(0.8, abs=1e-12)     # 1 - 6*4/(5*24)
    assert list(stats.ranks([3.0, 1.0, 3.0, 2.0])) == [3.5, 1.0, 3.5, 2.0]
    assert math.isnan(stats.pearson([1, 2, 3], [5, 5, 5]))


def test_permutation_p_is_exact():
    x, y = [4.0, 3.0, 2.0, 1.0], [0.1, 0.2, 0.3, 0.4]
    assert stats.spearman(x, y) == pytest.approx(-1.0)
    assert stats.permutation_p(x, y, stats.spearman) == pytest.approx(2 / 24)   # r = +-1 only


def _groups(slope, noise, seed=0):
    rng = np.random.default_rng(seed)
    losses = [6.0, 5.5, 5.0, 4.6, 4.3]
    return [(L, list(slope * L + noise * rng.standard_normal(3))) for L in losses]


def test_bootstrap_interval_and_verdicts():
    strong = stats.correlate(_groups(-0.2, 0.005), 500, 0.9)
    lo, hi = strong["spearman"]["ci"]
    assert strong["spearman"]["r"] == pytest.approx(-1.0) and -1.0 <= lo <= hi < 0
    assert stats.verdict(strong, 0.9).startswith("consistent with the claim")
    null = stats.correlate(_groups(0.0, 1.0, seed=3), 500, 0.9)
    assert null["spearman"]["ci"][0] < 0 < null["spearman"]["ci"][1]
    assert stats.verdict(null, 0.9).startswith("null result")
    opposite = stats.correlate(_groups(+0.2, 0.005), 500, 0.9)
    assert stats.verdict(opposite, 0.9).startswith("against the claim")


def test_auc_and_cell_result(tmp_path):
    assert cells.auc([(0, 0.0), (2, 1.0), (4, 1.0)], 4) == pytest.approx(0.75)
    d = tmp_path / "b8-s0"
    d.mkdir()
    rows = [{"step": 0, "m": 0.1}, {"step": 1, "loss": 3.0}, {"step": 2, "m": 0.3},
            {"step": 4, "m": 0.5}]
    (d / "metrics.jsonl").write_text("\n".join(map(json.dumps, rows)) + "\n{cut")
    (d / "rl_summary.json").write_text(json.dumps({"version": 4}))
    r = cells.cell_result(d, 8, 0, 5.0, 4, "m")
    assert r["finished"] and (r["score_start"], r["score_end"]) == (0.1, 0.5)
    assert r["auc"] == pytest.approx((2 * 0.2 + 2 * 0.4) / 4)
    assert not cells.is_finished(d, 5)


def test_summary_partial_and_written(tmp_path):
    rows = [{"cell": f"b{b}-s{s}", "budget": b, "seed": s, "val_loss": 7.0 - b / 100,
             "finished": not (b == 320 and s == 1), "score_start": 0.0,
             "score_end": b / 1000 + s / 10000, "auc": b / 2000, "curve": []}
            for b in (40, 80, 160, 320) for s in (0, 1)]
    s = report.write_report(tmp_path, rows, 8, {}, "cmd", 200, 0.95)
    assert s["partial"] and s["cells_finished"] == 7
    assert s["verdict"].startswith("PARTIAL (not the result; 7 of 8 cells)")
    assert s["correlation"]["score_end"]["spearman"]["r"] == pytest.approx(-1.0)
    assert [b["seeds"] for b in s["budgets"]] == [[0, 1], [0, 1], [0, 1], [0]]
    saved = json.loads((tmp_path / "sweep.json").read_text())
    assert saved["partial"] and saved["correlation"]["score_start"]["pearson"]["r"] is None
    assert "PARTIAL" in (tmp_path / "sweep.txt").read_text()
    assert (tmp_path / "sweep.png").stat().st_size > 1000


def test_sweep_config_validation_and_cell_selection(tmp_path):
    from experiments.cpt_rl_sweep import cells_to_run
    with pytest.raises(ConfigError, match="strictly increasing"):
        SweepConfig(budgets=(80, 40))
    with pytest.raises(ConfigError, match="not cells of this sweep"):
        SweepConfig(cells=("b50-s0",))
    sw = SweepConfig(budgets=(4, 8), seeds=(0, 1))
    done = tmp_path / "cells" / "b4-s1"
    done.mkdir(parents=True)
    (done / "rl_summary.json").write_text(json.dumps({"version": 3}))
    assert cells_to_run(sw, tmp_path, 3) == [(4, 0), (8, 0), (8, 1)]
    rerun = dataclasses.replace(sw, cells=("b4-s1",))
    assert cells_to_run(rerun, tmp_path, 3) == [(4, 1)] and not done.exists()


def test_completion_family_config_and_scoring():
    from composer_jax.rl.tasks.stdlib_completion import (StdlibCompletionConfig, module_source,
                                                         prefix_score)
    assert prefix_score([5, 6, 9, 8], [5, 6, 7, 8]) == (0.5, False)
    assert prefix_score([5, 6], [5, 6]) == (1.0, True)
    with pytest.raises(ConfigError, match="held-out modules"):
        StdlibCompletionConfig(train_modules=("os",))
    with pytest.raises(ConfigError, match="overlap"):
        StdlibCompletionConfig(train_modules=("heapq",), eval_modules=("heapq", "shlex"))
    assert "def bisect_left" in module_source("bisect")


TINY = ["--set", "sweep.budgets=2,4", "--set", "sweep.seeds=0", "--set", "sweep.bootstrap=100",
        "--set", "sweep.cpt_set=train.warmup_steps=1,model.num_layers=1,model.first_k_dense=0,"
                 "model.mtp_depth=0",
        "--set", "rl.steps=2", "--set", "train.steps=2", "--set", "rl.job.eval_every=2",
        "--set", "rl.job.checkpoint_every=2", "--set", "rl.task.num_train_tasks=4",
        "--set", "rl.task.num_eval_tasks=4", "--set", "rl.group_size=2",
        "--set", "rl.batch_groups=2", "--set", "rl.job.num_rollout_workers=4"]


def test_sweep_2x1_end_to_end(tmp_path):
    """The experiment as launch.py runs it: pretraining to 4 steps, RL cells from the step-2 and
    step-4 checkpoints, the report; a rerun skips both finished cells."""
    from composer_jax.api import make_config
    from composer_jax.registry import get
    exp = get("cpt_rl_sweep")
    over = [TINY[i + 1] for i in range(0, len(TINY), 2)]
    cfg = make_config(exp.make_config(), over)
    s = exp.run(cfg, tmp_path)
    assert not s["partial"] and s["cells_finished"] == 2
    (b2, b4) = s["budgets"]
    assert b4["val_loss"] < b2["val_loss"]                  # more pretraining, lower loss
    for b in (b2, b4):
        assert 0.0 <= b["score_end"]["mean"] <= 1.0 and math.isfinite(b["auc"]["mean"])
    saved = json.loads((tmp_path / "sweep.json").read_text())
    assert [c["cell"] for c in saved["cells"]] == ["b2-s0", "b4-s0"]
    assert [len(c["curve"]) for c in saved["cells"]] == [2, 2]        # versions 0 and 2
    stamp = (tmp_path / "cells" / "b2-s0" / "rl_summary.json").stat().st_mtime_ns
    exp.run(cfg, tmp_path)
    assert (tmp_path / "cells" / "b2-s0" / "rl_summary.json").stat().st_mtime_ns == stamp


def test_report_only_reads_cells_on_disk(tmp_path):
    """`sweep.report_only`: no training, a PARTIAL report of the one finished cell."""
    from composer_jax.api import make_config
    from composer_jax.registry import get
    exp = get("cpt_rl_sweep")
    cfg = make_config(exp.make_config(), ["sweep.budgets=4,8", "sweep.seeds=0",
                                          "sweep.report_only=true", "sweep.bootstrap=100",
                                          "rl.steps=2", "train.steps=2"])
    (tmp_path / "cpt").mkdir()
    (tmp_path / "cpt" / "metrics.jsonl").write_text(
        json.dumps({"step": 4, "val_loss": 6.5}) + "\n")        # step 8 not validated yet
    d = tmp_path / "cells" / "b4-s0"
    d.mkdir(parents=True)
    rows = [{"step": 0, "heldout_stdlib_completion_reward_mean": 0.25},
            {"step": 2, "heldout_stdlib_completion_reward_mean": 0.5}]
    (d / "metrics.jsonl").write_text("\n".join(map(json.dumps, rows)))
    (d / "rl_summary.json").write_text(json.dumps({"version": 2}))
    s = exp.run(cfg, tmp_path)
    assert s["partial"] and s["cells_finished"] == 1
    assert s["budgets"][0]["val_loss"] == 6.5
    assert s["budgets"][0]["auc"]["mean"] == pytest.approx(0.375)
    assert not (tmp_path / "pretrained").exists()


def test_completion_tasks_are_held_out_code_and_fixed_across_run_seeds(tmp_path):
    """Tasks are contiguous (prompt, target) slices of the modules' token streams; training and
    held-out tasks come from different modules; the held-out set does not depend on cfg.seed."""
    from composer_jax.api import make_config
    from composer_jax.data.tokenizer import SplitPattern, train_tokenizer
    from composer_jax.registry import get
    from composer_jax.rl.tasks.stdlib_completion import StdlibCompletionFamily, module_source
    tok = train_tokenizer([module_source(m) for m in ("bisect", "shlex")], 512, SplitPattern.KIMI)
    tok.save(tmp_path / "tokenizer.json")
    base = get("cpt_rl_sweep").make_config()
    fams = [StdlibCompletionFamily(make_config(base, [
        f"rl.task.init_from={tmp_path}", "rl.task.train_modules=bisect",
        "rl.task.eval_modules=shlex", "rl.task.num_train_tasks=6", "rl.task.num_eval_tasks=5",
        "rl.task.prompt_tokens=16", "rl.task.target_tokens=3", f"seed={seed}"])) for seed in (0, 1)]
    assert fams[0].make_tasks("eval") == fams[1].make_tasks("eval")
    assert len(fams[0].make_tasks("train")) == 6 and len(fams[0].make_tasks("eval")) == 5
    for split, mod in (("train", "bisect"), ("eval", "shlex")):
        stream = tok.encode(module_source(mod))
        for tid in fams[0].make_tasks(split):
            m, pos = tid.split(":")
            prompt, target = fams[0].task(tid)
            assert m == mod and len(prompt) == 16 and len(target) == 3
            assert list(prompt) + list(target) == stream[int(pos) - 16:int(pos) + 3]
            assert tok.decode(target).strip()
