"""A researcher's day one (issue 42): each "what hurts" of the issue, as a test.

Config keys are absl flags with help; nothing is silent (a rerun with other settings writes
nothing, RL runs reach W&B, a task family's real error is shown, a crashing score() fails with a
message); eval writes to a workdir named after its policy.
"""
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from composer_jax import api, registry
from composer_jax.config import Config
from composer_jax.errors import ConfigError
from composer_jax.overrides import config_keys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _launch(*args, env=None, timeout=240):
    return subprocess.run([sys.executable, "launch.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def _shown(stdout: str) -> dict[str, str]:
    return {ln.split()[1]: ln for ln in stdout.splitlines()[1:] if len(ln.split()) > 2}


# --- config keys are absl flags --------------------------------------------------------------


def test_config_keys_are_flags_and_set_is_an_alias():
    a = _launch("--experiment=rl_async", "--config.rl.steps=5", "--config.rl.task.max_turns=3",
                "--show_config")
    b = _launch("--experiment=rl_async", "--set", "rl.steps=5", "--set=rl.task.max_turns=3",
                "--show_config")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert a.stdout == b.stdout
    rows = _shown(a.stdout)
    assert rows["rl.steps"].split()[3] == "5" and rows["rl.task.max_turns"].split()[3] == "3"
    bad = _launch("--experiment=rl_async", "--config.rl.steps=five", "--show_config")
    assert bad.returncode == 2 and "config key rl.steps: expected an int, got 'five'" in bad.stderr


def test_every_key_has_help_from_its_field():
    missing = [k.key for k in config_keys(Config()) if not k.help]
    assert not missing, f"config keys without a comment or docstring clause: {missing}"
    r = _launch("--helpfull")
    for k in config_keys(Config()):
        assert re.search(rf"--(\[no\])?config\.{re.escape(k.key)}: \S", r.stdout), k.key


def test_the_hand_written_parser_is_gone():
    src = (ROOT / "composer_jax" / "overrides.py").read_text()
    assert "def parse_value" not in src and "ml_collections" in (
        ROOT / "composer_jax" / "config" / "flags.py").read_text()


# --- nothing silent --------------------------------------------------------------------------


def test_rerun_with_other_settings_is_refused_and_writes_nothing(tmp_path):
    cfg = api.make_config("cpt_debug", {"train.steps": 30})
    api.save_config(cfg, tmp_path / "config.json")
    before = (tmp_path / "config.json").read_bytes()
    r = _launch("--experiment=cpt_debug", f"--workdir={tmp_path}", "--config.train.steps=30",
                "--config.data.seq_len=64")
    assert r.returncode == 2 and "data.seq_len: 128 -> 64" in r.stderr, r.stderr
    assert "Nothing was run or written" in r.stderr
    assert (tmp_path / "config.json").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


def test_rl_driver_metrics_reach_wandb(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    from composer_jax.rl.driver import _Metrics
    cfg = api.make_config("rl_async", {"train.wandb_project": "cj-test", "train.wandb_mode":
                                       "offline", "train.wandb_group": "g1"})
    api.save_config(cfg, tmp_path / "config.json")          # what launch.py writes first
    m = _Metrics(tmp_path, resume_from=0)
    m(1, {"reward_mean": 0.5})
    assert m.writer._wandb is not None and m.writer._wandb.run.group == "g1"
    m.writer.close()
    assert list((tmp_path / "wandb").glob("offline-run-*"))


def _family_module(tmp_path, name: str, body: str) -> str:
    pkg = tmp_path / "famtest"
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / f"{name}.py").write_text(body)
    return f"famtest.{name}"


def test_a_task_family_module_error_is_shown(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    typo = _family_module(tmp_path, "typo", "import composer_jax\nx = undefined_name\n")
    with pytest.raises(ConfigError, match=r"typo\.py:2: NameError: name 'undefined_name'"):
        api.make_config("rl_async", [f"rl.task={typo}"])
    nofam = _family_module(tmp_path, "nofam", "X = 1\n")
    with pytest.raises(ConfigError, match="imported but registered no task family"):
        api.make_config("rl_async", [f"rl.task={nofam}"])


def test_a_crash_in_score_fails_the_episodes_with_a_message(tmp_path):
    letter = (ROOT / "examples" / "rl_task_letter.py").read_text()
    body = letter.replace('        letter, text = task_id.split("/")[0]',
                          '        raise KeyError("boom in score")\n'
                          '        letter, text = task_id.split("/")[0]')
    assert body != letter
    mod = _family_module(tmp_path, "badscore", body)
    r = _launch("--experiment=rl_async", f"--config.rl.task={mod}", "--config.rl.steps=2",
                f"--workdir={tmp_path / 'run'}",
                env={"PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}", "JAX_PLATFORMS": "cpu"})
    assert r.returncode == 2, r.stderr[-2000:]
    assert "every rollout of this step failed" in r.stderr and "KeyError: 'boom in score'" in r.stderr
    assert "Traceback" not in r.stderr


# --- defaults --------------------------------------------------------------------------------


def test_eval_writes_to_a_workdir_named_after_the_policy():
    exp = registry.get("eval")
    assert exp.default_workdir(api.make_config("eval", ["eval.policy=heuristic"])) == \
        "runs/eval_heuristic"
    assert exp.default_workdir(api.make_config("eval", ["eval.policy=runs/rl_async@20"])) == \
        "runs/eval_rl_async@20"
    assert registry.get("cpt_debug").default_workdir(api.make_config("cpt_debug")) == \
        "runs/cpt_debug"
