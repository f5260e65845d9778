"""The environment without bubblewrap (Colab, laptops): the fallback backend runs the whole env path
(generation, oracle, null) with the right interpreters; short or failed generation is an error with
reason counts; RL on environment rewards refuses the fallback unless opted in."""
import dataclasses
import json
import os
import pathlib
import shutil
import tempfile
import warnings

import pytest

from composer_jax.env import open_workspace
from composer_jax.env.check import EmptyPoolError, check_pool
from composer_jax.env.config import EnvConfig, SandboxBackend
from composer_jax.env.pythons import find_pythons
from composer_jax.env.sandbox import _link_or_copy, bwrap_works, resolve_backend
from composer_jax.env.tasks.generate import GenerationError, generate_pool
from composer_jax.env.trust import (SANDBOXED, UNSANDBOXED, record_in_summary,
                                    require_sandboxed_rewards)
from composer_jax.errors import ConfigError

NEWEST = sorted(find_pythons(), key=lambda v: tuple(map(int, v.split("."))))[-1]


@pytest.fixture
def no_bwrap(tmp_path, monkeypatch):
    """PATH holds every host command but `bwrap` (as on a machine without bubblewrap)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for d in ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"):
        if os.path.isdir(d):
            for f in os.listdir(d):
                if f != "bwrap" and not (bindir / f).exists():
                    (bindir / f).symlink_to(os.path.join(d, f))
    monkeypatch.setenv("PATH", str(bindir))
    bwrap_works.cache_clear()
    yield
    bwrap_works.cache_clear()


def _fallback(**kw) -> EnvConfig:
    base = dict(sandbox_backend=SandboxBackend.FALLBACK, python_versions=(NEWEST,),
                modules=("graphlib",), kinds=("bug",), package_sources=(), workers=1,
                use_embeddings=False, command_timeout_s=20.0,
                # generous time limits: CI machines are loaded (the path is tested, not speed)
                max_task_test_seconds=5.0, max_test_file_seconds=10.0, baseline_timeout_s=60.0,
                test_timeout_s=60.0)
    return EnvConfig(**{**base, **kw})


def test_auto_without_bwrap_resolves_to_the_fallback(no_bwrap):
    assert not bwrap_works()
    with pytest.warns(RuntimeWarning, match="WITHOUT A SANDBOX"):
        assert resolve_backend(SandboxBackend.AUTO) == SandboxBackend.FALLBACK


@pytest.mark.filterwarnings("ignore:.*WITHOUT A SANDBOX:RuntimeWarning")
def test_fallback_runs_the_whole_env_path(no_bwrap, tmp_path, sample_dir):
    """Generate a small pool, then oracle and null, all on the fallback backend; then a second
    generation asking for more than the sources give is an error that says they ran dry."""
    cfg = _fallback(num_tasks=2, max_tasks_per_module=2)
    summary = generate_pool(cfg, tmp_path / "pool", progress=False)
    assert summary["num_tasks"] == 2 and summary["modules_usable"] == 1
    check = check_pool(cfg, tmp_path / "pool", tmp_path / "check", progress=False)
    assert check["num_tasks"] == 2
    assert check["oracle_resolved_rate"] == 1.0 and check["null_resolved_rate"] == 0.0
    assert check["oracle_tampered"] == 0 and check["null_tampered"] == 0
    # The commands' `python` is the configured CPython with its own stdlib (as root: the mirror of
    # an install the sandbox uid cannot read, never another Python's stdlib found by search).
    with open_workspace(sample_dir, cfg) as ws:
        out = ws.run_command("python -c 'import os, sys; print(sys.version_info[:2]); "
                             "print(os.path.dirname(os.__file__))'").output.split("\n")
        assert out[0] == str(tuple(map(int, NEWEST.split("."))))
        assert os.path.realpath(out[1]) == os.path.realpath(ws.python.stdlib)
        assert ws.python.version == NEWEST
    more = dataclasses.replace(cfg, num_tasks=10)
    with pytest.raises(GenerationError, match="made 2 of the 10 tasks") as e:
        generate_pool(more, tmp_path / "pool", progress=False)
    assert "sources ran dry" in str(e.value) and e.value.summary["num_tasks"] == 2
    ok = dataclasses.replace(more, min_task_fraction=0.2)
    assert generate_pool(ok, tmp_path / "pool", progress=False)["num_tasks"] == 2


@pytest.fixture
def broken_python(monkeypatch):
    """A CPython (newest version, found first through CJ_PYTHON_PREFIXES) whose `unittest` raises
    on import: a hard-linked copy of the real install with that one file replaced."""
    real = find_pythons()[NEWEST]
    top = tempfile.mkdtemp(prefix="cj-broken-python-")
    os.chmod(top, 0o755)
    prefix = os.path.join(top, "py")
    shutil.copytree(real.prefix, prefix, symlinks=True, copy_function=_link_or_copy,
                    ignore=shutil.ignore_patterns("site-packages"))
    ut = pathlib.Path(prefix, "lib", f"python{NEWEST}", "unittest")
    for f in [ut / "__init__.py", *(ut / "__pycache__").glob("__init__.*")]:
        f.unlink()  # never write through a hard link into the real install
    (ut / "__init__.py").write_text("raise ImportError('deliberately broken unittest')\n")
    monkeypatch.setenv("CJ_PYTHON_PREFIXES", prefix)
    find_pythons.cache_clear()
    assert find_pythons()[NEWEST].prefix == prefix
    yield prefix
    monkeypatch.delenv("CJ_PYTHON_PREFIXES")
    find_pythons.cache_clear()
    shutil.rmtree(top, ignore_errors=True)


@pytest.mark.filterwarnings("ignore:.*WITHOUT A SANDBOX:RuntimeWarning")
def test_broken_interpreters_fail_generation_with_reason_counts(broken_python, tmp_path):
    cfg = _fallback(num_tasks=2, modules=("graphlib", "fnmatch"))
    with pytest.raises(GenerationError) as e:
        generate_pool(cfg, tmp_path / "pool", progress=False)
    msg, summary = str(e.value), e.value.summary
    assert summary["num_tasks"] == 0 and summary["modules_baselined"] == 2
    assert summary["modules_usable"] == 0
    [(reason, count)] = summary["baseline_failures"].items()
    assert count == 2 and reason.startswith("baseline run failed")
    assert "deliberately broken" in reason
    assert "made 0 of the 2 tasks" in msg and f"{count:6d}  {reason}" in msg
    assert "env_doctor" in msg
    # env_check on that pool: empty because generation failed (not "never run").
    with pytest.raises(EmptyPoolError, match="empty because generation failed") as e:
        check_pool(cfg, tmp_path / "pool", tmp_path, progress=False)
    assert f"{2:6d}  {reason}" in str(e.value)


def test_env_check_on_a_never_generated_pool_says_so(tmp_path):
    with pytest.raises(EmptyPoolError, match="env_generate was never run there"):
        check_pool(EnvConfig(), tmp_path / "pool", tmp_path, progress=False)


def test_rl_rewards_refuse_the_fallback_without_the_opt_in(tmp_path):
    with pytest.raises(ConfigError, match="env.allow_unsandboxed_rewards=true"):
        require_sandboxed_rewards(_fallback(), "rl.tasks=coding")
    opted = _fallback(allow_unsandboxed_rewards=True)
    assert require_sandboxed_rewards(opted, "rl.tasks=coding") == UNSANDBOXED
    if bwrap_works():
        bw = dataclasses.replace(opted, sandbox_backend=SandboxBackend.BWRAP)
        assert require_sandboxed_rewards(bw, "rl.tasks=coding") == SANDBOXED
    (tmp_path / "rl_summary.json").write_text(json.dumps({"version": 3}))
    record_in_summary(tmp_path / "rl_summary.json", UNSANDBOXED)
    assert json.loads((tmp_path / "rl_summary.json").read_text()) == {
        "version": 3, "reward_sandbox": UNSANDBOXED}


def test_rl_coding_run_refuses_before_building_anything(no_bwrap, tmp_path, monkeypatch):
    import experiments.rl as rl_exp
    from composer_jax.config import Config, RLTasks

    def boom(*a, **k):
        raise AssertionError("built something before the sandbox check")
    monkeypatch.setattr(rl_exp, "prepare_coding", boom)
    cfg = rl_exp._config(2)
    cfg = dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, tasks=RLTasks.CODING))
    assert isinstance(cfg, Config) and cfg.env.sandbox_backend == SandboxBackend.AUTO
    with pytest.raises(ConfigError, match="env.allow_unsandboxed_rewards"):
        rl_exp.run(cfg, tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env,
                                                               allow_unsandboxed_rewards=True))
        with pytest.raises(AssertionError, match="built something"):  # gets past the check
            rl_exp.run(cfg, tmp_path)


@pytest.mark.filterwarnings("ignore:.*WITHOUT A SANDBOX:RuntimeWarning")
def test_env_doctor_reports_the_fallback_and_passes_its_smoke_test(no_bwrap, tmp_path):
    from composer_jax.env.doctor import diagnose
    cfg = EnvConfig(python_versions=(NEWEST,), max_task_test_seconds=5.0,
                    max_test_file_seconds=10.0, baseline_timeout_s=60.0, test_timeout_s=60.0)
    report = diagnose(cfg, tmp_path)
    assert report["requested_backend"] == "auto" and report["backend"] == "fallback"
    assert report["bwrap"] == {"path": None, "works": False, "error": "`bwrap` is not on PATH"}
    assert set(report["namespaces"]) >= {"user", "mount", "pid", "net", "ipc"}
    assert report["interpreters"]["configured"][NEWEST].startswith("ok")
    assert "env.allow_unsandboxed_rewards=true" in report["rl_training"]
    smoke = report["smoke_test"]
    assert smoke["ok"] and smoke["oracle_resolved"] == 1.0 and smoke["null_resolved"] == 0.0
    assert smoke["python"] == {NEWEST: 1}


def test_shortfall_advice_follows_the_most_common_failure():
    from composer_jax.env.tasks.generate import reason_key, shortfall_message
    base = {"num_tasks": 0, "modules_baselined": 3, "modules_usable": 1, "stats": {"candidates": 9},
            "baseline_failures": {}, "rejections": {}}
    cases = [({"modules_baselined": 0, "modules_usable": 0}, "no source module was found"),
             ({"modules_usable": 0}, "env_doctor"),
             ({"rejections": {"task tests too slow: Ns": 7, "flaky": 2}}, "ran slower than"),
             ({"rejections": {"no test fails before the fix": 9}}, "sources ran dry")]
    for over, advice in cases:
        msg = shortfall_message({**base, **over}, EnvConfig(num_tasks=6), "/pool")
        assert msg.startswith("env_generate made 0 of the 6 tasks") and advice in msg, (over, msg)
    assert reason_key("timed out after 3.5s in /tmp/x/y.py\n line 12") == \
        "timed out after Ns in PATH line N"
