"""The task-family registry and protocol (`composer_jax.rl.tasks`, `composer_jax.agent.tasks`),
the nested rl config sections, the JAX-free agent package and rollout workers, and the README's
"Adding an RL task" example run end to end."""
import json
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from composer_jax.config import (SECTION_PRESETS, CodingTaskConfig, Config, ConfigError,
                                 ParityTaskConfig, from_dict, to_dict)
from composer_jax.overrides import apply_overrides

ROOT = pathlib.Path(__file__).resolve().parents[2]

_NO_JAX = """
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("jax", "jaxlib", "flax", "optax", "orbax"):
            raise ImportError("JAX is unimportable in this test: " + name)
sys.meta_path.insert(0, Block())
"""


def _run_without_jax(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", _NO_JAX + code], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_agent_package_and_every_family_worker_side_import_without_jax():
    """`import composer_jax.agent` (every module), the rollout worker entry points and the env
    side of an episode of each single-turn family run where `import jax` raises."""
    out = _run_without_jax("""
import composer_jax.agent, composer_jax.agent.episode, composer_jax.agent.token_agent
import composer_jax.agent.rollout, composer_jax.agent.summarize, composer_jax.agent.tasks
import composer_jax.agent.policy_client, composer_jax.agent.parity
import composer_jax.rl.worker_process, composer_jax.rl.backend_local, composer_jax.rl.tasks.coding
from composer_jax.config import Config, SECTION_PRESETS
from composer_jax.overrides import apply_overrides
from composer_jax.protocol.requests import Completion
from composer_jax.rl.program import build_program
from composer_jax.rl.task_program import task_program_spec

class FakePolicy:            # the policy server's `generate`, without an engine
    def call(self, method, ids, params):
        assert method == "generate"
        c = Completion(0, ids, params, tokens=[5, 6], logprobs=[-1.0, -1.0],
                       raw_logprobs=[-1.0, -1.0], versions=[0, 0], finish_reason="max_new_tokens")
        return c.to_fields()

for task in ("parity", "examples.rl_task_letter"):
    cfg = apply_overrides(Config(), ["rl.task=" + task, "model.vocab_size=320"], SECTION_PRESETS)
    program = build_program(task_program_spec(cfg))      # what a worker process builds
    tid = program.train_tasks()[0]
    r = program.run_episode(tid, 3, FakePolicy(), greedy=False)
    print(task, len(program.train_tasks()), len(program.eval_tasks()), r.segments[0].num_trainable)
cfg = apply_overrides(Config(), ["rl.task=lookup", "model.vocab_size=448"], SECTION_PRESETS)
program = build_program(task_program_spec(cfg))
print("lookup", len(program.train_tasks()), len(program.eval_tasks()))
print(sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "flax")))
""")
    assert out.splitlines() == ["parity 64 16 2", "examples.rl_task_letter 64 16 2",
                                "lookup 64 16", "[]"]


def test_coding_family_worker_side_builds_without_jax(tmp_path):
    """The coding family's env side (pool, tokenizer, token-level agent) builds where JAX is
    unimportable, as a rollout worker process builds it."""
    sys.path.insert(0, str(ROOT / "tests" / "rl"))
    from test_rl_coding import _setup
    cfg, _ = _setup(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(to_dict(cfg)))
    out = _run_without_jax(f"""
import json
from composer_jax.rl.program import ProgramSpec, build_program
program = build_program(ProgramSpec("composer_jax.rl.task_program:make",
                                    {{"config": json.load(open({str(tmp_path / "config.json")!r}))}}))
print(program.train_tasks(), program.eval_tasks(), type(program.family).__name__)
print(sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "flax")))
""")
    assert out.splitlines() == ["['t1'] [] CodingFamily", "[]"]


def test_registry_names_builtins_and_loads_a_plugin_by_module_path():
    from composer_jax.rl import tasks
    assert {"parity", "coding", "lookup"} <= set(tasks.names())
    with pytest.raises(ConfigError, match="registered: .*parity"):
        tasks.get("nope")
    fam = tasks.get("examples.rl_task_letter")
    assert fam.name == "examples.rl_task_letter" and "examples.rl_task_letter" in tasks.names()
    cfg = apply_overrides(Config(), ["rl.task=examples.rl_task_letter", "rl.task.letters=ab",
                                     "rl.task.num_eval_tasks=3"], SECTION_PRESETS)
    f = tasks.family_of(cfg)
    train, held = f.make_tasks("train"), f.make_tasks("eval")
    assert len(train) == 64 and len(held) == 3 and not set(train) & set(held)
    assert f.score("a/x", "aaa") == (1.0, True) and f.score("a/x", "ab") == (0.5, False)
    assert from_dict(Config, to_dict(cfg)) == cfg              # config.json round trip


def test_rl_sections_validate_and_old_flat_keys_name_the_new_key():
    cfg = apply_overrides(Config(), ["rl.task=coding", "rl.task.init_from=/w", "rl.job.backend=ray",
                                     "rl.weight_sync.dtype=", "rl.steps=3"], SECTION_PRESETS)
    assert isinstance(cfg.rl.task, CodingTaskConfig) and cfg.rl.task.init_from == "/w"
    assert cfg.rl.job.backend.value == "ray" and cfg.rl.weight_sync.dtype == ""
    for old, new in [("rl.backend=ray", "rl.job.backend"), ("rl.tasks=coding", "rl.task"),
                     ("rl.parity_kinds=even", "rl.task.kinds"),
                     ("rl.weight_sync_codec=xor", "rl.weight_sync.codec"),
                     ("rl.full_snapshot_every=3", "rl.weight_sync.full_snapshot_every")]:
        with pytest.raises(ConfigError, match=f"moved to '{re.escape(new)}'"):
            apply_overrides(Config(), [old], SECTION_PRESETS)
    with pytest.raises(ConfigError, match="rl.task.kinds must be"):
        apply_overrides(Config(), ["rl.task.kinds=blue"], SECTION_PRESETS)
    with pytest.raises(ConfigError, match="rl.job.num_rollout_workers must be >= 1"):
        apply_overrides(Config(), ["rl.job.num_rollout_workers=0"], SECTION_PRESETS)
    with pytest.raises(ConfigError, match="unknown config key 'rl.task.init_from'"):
        apply_overrides(Config(), ["rl.task.init_from=x"], SECTION_PRESETS)   # parity has none


def test_old_flat_rl_config_json_is_migrated():
    d = to_dict(Config())
    d["rl"] = {"tasks": "coding", "init_from": "/w", "backend": "ray", "num_rollout_workers": 3,
               "weight_sync_dtype": "", "full_snapshot_every": 7, "parity_kinds": ["even"],
               "num_train_tasks": 5, "steps": 9}
    rl = from_dict(Config, d).rl
    assert rl.task == CodingTaskConfig(num_train_tasks=5, init_from="/w")
    assert (rl.job.backend.value, rl.job.num_rollout_workers) == ("ray", 3)
    assert (rl.weight_sync.dtype, rl.weight_sync.full_snapshot_every, rl.steps) == ("", 7, 9)
    d["rl"] = {"parity_kinds": ["even"], "env_latency_scale": 0.5}
    assert from_dict(Config, d).rl.task == ParityTaskConfig(kinds=("even",), env_latency_scale=0.5)


def test_completion_fields_round_trip():
    from composer_jax.protocol.params import SamplingParams
    from composer_jax.protocol.requests import Completion
    c = Completion(3, [1, 2], SamplingParams(), tokens=[4], logprobs=[-0.5], raw_logprobs=[-0.7],
                   versions=[2], router_indices=[np.ones((2, 1), np.int32)],
                   prompt_router_indices=np.zeros((1, 2, 1), np.int32), prompt_router_start=1,
                   finish_reason="stop_token")
    back = Completion.from_fields(c.to_fields())
    assert back.to_fields().keys() == c.to_fields().keys()
    assert (back.tokens, back.logprobs, back.versions, back.finish_reason) == ([4], [-0.5], [2],
                                                                               "stop_token")
    np.testing.assert_array_equal(back.prompt_router_indices, c.prompt_router_indices)
    assert back.prompt_router_start == 1


def test_readme_example_is_the_module_and_runs(tmp_path):
    """docs/rl.md "Adding an RL task": its code block is examples/rl_task_letter.py, and the command
    it gives finishes and logs reward."""
    readme = (ROOT / "docs" / "rl.md").read_text()
    section = readme.split("### Adding an RL task", 1)[1]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert block == (ROOT / "examples" / "rl_task_letter.py").read_text()
    cmd = [sys.executable, str(ROOT / "launch.py"), "--experiment=rl_async",
           f"--workdir={tmp_path}", "--set", "rl.task=examples.rl_task_letter",
           "--set", "rl.steps=5"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward_mean"] for r in rows if "reward_mean" in r]
    assert len(rewards) == 5 and all(0.0 <= x <= 1.0 for x in rewards)
    assert json.loads((tmp_path / "config.json").read_text())["rl"]["task"]["family"] == \
        "examples.rl_task_letter"
