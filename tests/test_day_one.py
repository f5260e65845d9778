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
from composer_jax.agent import lookup as lk
from composer_jax.config import Config, to_dict
from composer_jax.errors import ConfigError
from composer_jax.model import init_model
from composer_jax.overrides import config_keys
from composer_jax.rl import family_eval, policy_server
from composer_jax.rl.task_program import TaskProgram
from composer_jax.rl.tasks import lookup_sft
from composer_jax.train.checkpoint import Checkpointer
from composer_jax.train.step import build
from experiments import eval as eval_experiment
from experiments.rl import _coding_ladder_config

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


def test_a_task_family_is_the_base_every_set_key_is_applied_on():
    # rl.eval_greedy=false and rl.max_new_tokens=40 equal the lookup defaults, not the coding
    # ladder's (true / 160): the user's value is kept, the rest are the ladder's
    r = _launch("--experiment=rl_async", "--set", "rl.task=coding", "--set", "rl.task.levels=1",
                "--set", "rl.eval_greedy=false", "--set", "rl.max_new_tokens=40", "--show_config")
    assert r.returncode == 0, r.stderr
    value = {k: row.split()[3] for k, row in _shown(r.stdout).items()}
    assert (value["rl.eval_greedy"], value["rl.max_new_tokens"]) == ("False", "40")
    ladder = _coding_ladder_config(2)
    assert (value["env.max_turns"], value["rl.seq_len"], value["rl.task.levels"]) == (
        str(ladder.env.max_turns), str(ladder.rl.seq_len), "(1,)")
    bad = _launch("--experiment=rl_async", "--set", "rl.task=coding", "--set", "train.steps=7",
                  "--show_config")
    assert bad.returncode == 2 and "set rl.steps instead" in bad.stderr


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


def test_rerunning_an_sft_command_resumes_it(tmp_path):
    # sft records its resolved settings (the prompt from env.*, the sample source) in config.json;
    # the same command again is compared with that record, not refused over what it resolved
    from composer_jax.rerun import check_rerun

    exp = registry.get("sft")
    cfg = api.make_config("sft", {"env.declare_tools": False, "train.steps": 40})
    recorded = exp.record(cfg, tmp_path)
    assert recorded.data.sft_declare_tools is False and recorded.data.sft_source != cfg.data.sft_source
    api.save_config(recorded, tmp_path / "config.json")
    check_rerun(exp.record(api.make_config("sft", {"env.declare_tools": False, "train.steps": 80}),
                           tmp_path), tmp_path)
    with pytest.raises(ConfigError, match="data.sft_declare_tools: False -> True"):
        check_rerun(exp.record(api.make_config("sft", {"train.steps": 40}), tmp_path), tmp_path)


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


def test_a_checkpoint_evaluation_engine_starts_from_the_checkpoint(monkeypatch):
    """The short version of the next test: evaluate_run's engine is built on the evaluated model
    and the program's initial policy (the lookup SFT, trained on an empty cache) is never built."""
    built = []
    monkeypatch.setattr(policy_server, "EnginePolicyServer",
                        lambda cfg, model, settings: built.append(model) or FakeServer())
    program = TaskProgram(to_dict(api.make_config("rl_async")))
    monkeypatch.setattr(program, "initial_model", lambda: pytest.fail("built the initial policy"))
    checkpoint = object()
    ev = family_eval.FamilyEvaluator(program, program.cfg, engine_model=checkpoint)
    monkeypatch.setattr(family_eval.nnx, "split", lambda model, *a: (None, {}, {}))
    monkeypatch.setattr(family_eval.nnx, "to_pure_dict", lambda state: state)
    monkeypatch.setattr(family_eval, "publishable", lambda params, buffers: {})
    monkeypatch.setattr(family_eval, "WeightStore", lambda *a, **k: FakeServer())
    ev._load(checkpoint, 3)
    assert built == [checkpoint] and ev._server.loaded == 3


class FakeServer:
    """An engine policy server (or a weight store) that records what it was given."""
    def load_from(self, store, version):
        self.loaded = version

    def publish(self, version, weights):
        pass


@pytest.mark.slow
def test_evaluating_a_run_builds_no_initial_policy(tmp_path, monkeypatch):
    """eval of an RL run scores the run's checkpoint; on an empty cache it used to train the lookup
    SFT first (the engine was built on the family's initial policy, then overwritten). Its
    metrics also reach TensorBoard (eval wrote none)."""
    cfg = api.make_config("rl_async", {"rl.task.num_eval_tasks": 2, "rl.task.max_turns": 2,
                                       "rl.max_new_tokens": 8})
    run = tmp_path / "run"
    model = init_model(cfg.model, 7, cfg.execution, cfg.train.init_std)
    _, state = build(model, cfg, loss="lm")
    ck = Checkpointer(run / "checkpoints", cfg, every=1, keep=1)
    ck.save(3, state, {}, force=True)
    ck.close()
    lk.lookup_tokenizer(cfg.model.vocab_size).save(run / "tokenizer.json")
    api.save_config(cfg, run / "config.json")

    def trained(*_a, **_k):
        raise AssertionError("evaluating a run built the family's initial policy")
    monkeypatch.setattr(lookup_sft, "initial_weights", trained)
    row = eval_experiment._run_family(api.make_config("eval", {"eval.policy": str(run)}),
                                      tmp_path / "eval_run")
    assert row["version"] == 3 and row["eval_num_tasks"] == 2 and "eval_resolved_rate" in row
    # ... and like every experiment's metrics, eval's reach TensorBoard too
    assert list((tmp_path / "eval_run" / "tb").glob("events.out.tfevents.*"))


# --- config keys: --help --------------------------------------------------------------------


def test_help_is_short_and_points_to_helpfull():
    """--help printed 308 lines (every config key); now the launcher's own flags and a pointer."""
    r = _launch("--experiment=rl_async", "--help")
    assert len(r.stdout.splitlines()) <= 80, len(r.stdout.splitlines())   # (absl exits 1)
    assert "--helpfull" in r.stdout and "--config.rl.lr:" not in r.stdout


# --- defaults: what `list` says --------------------------------------------------------------


def _listed() -> dict[str, str]:
    r = _launch("--experiment=list")
    assert r.returncode == 0, r.stderr
    return {ln.split()[0]: ln for ln in r.stdout.splitlines()[1:] if ln.startswith("  ")}


def test_list_states_each_experiments_measured_time():
    """`list` said ~3 min for cpt_debug (it took 5) and nothing about sft's hours: every listed
    experiment timed in benchmarks/results/experiment_times.txt (cpt_debug and sft at least) shows
    that time, any other says it is not timed, and no description carries a hand-written
    duration."""
    rows = {}
    for line in (ROOT / "benchmarks" / "results" / "experiment_times.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, setting, wall, _cpu, _load, rc, flags = line.split(" | ")
            rows[name] = (setting, float(wall), rc, flags)
    listed = _listed()
    assert set(rows) <= set(listed) and {"cpt_debug", "sft"} <= set(rows), set(rows) - set(listed)
    for name, line in listed.items():
        if name not in rows:
            assert line.endswith("[not timed]"), line
            continue
        setting, wall, rc, flags = rows[name]
        assert rc in ("0", "124"), f"{name}: its timed run failed (rc {rc})"
        shown = f"{wall:.0f} s" if wall < 90 else f"{wall / 60:.1f} min"
        assert line.endswith("]") and f"[{'> ' if rc == '124' else ''}{shown}" in line, line
        if setting == "short":
            assert flags in line and "short" in line, line
        description = line[:line.rindex("[")]
        assert not re.search(r"~\s*\d|\d+(\.\d+)?\s*(min|h|s/step)\b", description), line


def test_list_and_the_docs_name_the_same_experiments():
    """The README's experiment table and `list` disagreed (on what generate takes): the table in
    docs/experiments.md has one row per listed experiment, and generate's says what list says."""
    listed = _listed()
    page = (ROOT / "docs" / "experiments.md").read_text()
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)` \|.*$", page, re.M)}
    assert set(rows) == set(listed), set(rows) ^ set(listed)
    for word in ("train.init_from", "WORKDIR", "@STEP", "HF"):
        assert word in rows["generate"] and word in listed["generate"], word


# --- README: the layout ----------------------------------------------------------------------


def test_the_layout_names_every_part():
    """The README's layout (and docs/design.md's) missed overrides.py, agent/ and sweep/."""
    units = sorted(p.stem for p in (ROOT / "composer_jax").iterdir()
                   if (p.is_dir() and (p / "__init__.py").exists())
                   or (p.suffix == ".py" and p.stem != "__init__"))
    readme = (ROOT / "README.md").read_text()
    layout = readme[readme.index("## Layout"):].split("\n## ")[0]
    design = (ROOT / "docs" / "design.md").read_text()
    design = design[design.index("## Layering"):].split("\n## ")[0]
    assert [u for u in units if not re.search(rf"(?<![\w/]){u}(/|\.py)", layout)] == []
    assert [u for u in units if not re.search(rf"\b{u}\b", design)] == []
