"""`launch.py --experiment=eval --set eval.policy=<HF directory>` end to end: a tiny random model
saved as a Hugging Face checkpoint (config.json + safetensors + tokenizer.json) is loaded, run
with RL's token-level agent on the engine service over a two-task suite, and every report is
written with numbers that add up."""
import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import pytest

from composer_jax.config import tiny
from composer_jax.env.sandbox import bwrap_works
from composer_jax.eval.suite import build_suite, load_suite
from eval_helpers import make_pool, make_task
from test_eval_model_policy import VOCAB, random_model, small_tokenizer

pytestmark = pytest.mark.skipif(not bwrap_works(), reason="bubblewrap is not usable here")
REPO = pathlib.Path(__file__).resolve().parents[2]


def test_eval_experiment_on_an_hf_directory(tmp_path):
    from composer_jax.model.hf import save_hf

    make_pool(tmp_path / "pool", [make_task("bug-3.12-mini-000"), make_task("bug-3.12-mini-001")])
    build_suite(tmp_path / "pool", tmp_path / "suite", name="hf", size=2, min_median_lines=1)
    suite = load_suite(tmp_path / "suite")
    hf = tmp_path / "hf"
    save_hf(random_model(dataclasses.replace(tiny(), vocab_size=VOCAB, mtp_depth=0)), hf)
    small_tokenizer().save(hf / "tokenizer.json")
    work = tmp_path / "run"
    sets = {"eval.policy": hf, "eval.suite_dir": tmp_path / "suite", "eval.styles": "detailed",
            "eval.max_new_tokens": 8, "eval.max_turns": 2, "eval.max_context": 4096,
            "eval.concurrency": 2, "eval.price_prompt_per_mtok": 1.0,
            "eval.price_cached_per_mtok": 0.1, "eval.price_generated_per_mtok": 10.0}
    cmd = [sys.executable, str(REPO / "launch.py"), "--experiment=eval", f"--workdir={work}"]
    cmd += [f"--set={k}={v}" for k, v in sets.items()]
    env = {**os.environ, "COMPOSER_JAX_CACHE": str(tmp_path / "cache"), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["suite_id"] == suite.suite_id and summary["resolved_all"] == 0.0
    result = json.loads((work / "eval.json").read_text())
    assert result["policy"]["kind"] == "model" and result["policy"]["source"] == "hf"
    assert result["policy"]["path"] == str(hf)
    eps = result["episodes"]
    assert sorted(e["task_id"] for e in eps) == ["bug-3.12-mini-000", "bug-3.12-mini-001"]
    for e in eps:
        assert e["style"] == "detailed" and not e["resolved"] and not e["crashed"]
        assert 1 <= e["turns"] <= 2 and 1 <= e["generated_tokens"] <= 2 * 8
        assert e["prompt_tokens"] > 100 and e["regressions"] == 0
        fresh = e["prompt_tokens"] - e["cached_prompt_tokens"]
        assert e["price"] == pytest.approx((fresh + 0.1 * e["cached_prompt_tokens"]
                                            + 10.0 * e["generated_tokens"]) / 1e6)
    s = result["summary"]["all"]
    assert s["num_tasks"] == 2 and s["resolved"] == 0.0
    assert s["generated_tokens"] == pytest.approx(sum(e["generated_tokens"] for e in eps) / 2)
    assert "| detailed | 0.000" in (work / "eval.md").read_text()
    assert (work / "eval.png").stat().st_size > 1000
    row = json.loads((work / "metrics.jsonl").read_text().splitlines()[-1])
    assert row["eval_resolved_rate"] == 0.0 and row["num_tasks"] == 2
