"""Researcher ergonomics: the config API, --config/--show_config/--help, parse-time validation,
URL workdirs (gs://) reaching Orbax and the metric writers unchanged, multi-host auto-detection,
profiling, the optional W&B writer, tqdm.auto."""
import pathlib
import re
import subprocess
import sys

import pytest

from composer_jax import api
from composer_jax.config import Config, MeshConfig, TrainConfig
from composer_jax.errors import ConfigError
from composer_jax.parallel import multihost
from composer_jax.runlog import MetricsWriter, StepProfiler, read_metrics, run_path

ROOT = pathlib.Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------
# Config API and CLI
# ---------------------------------------------------------------------------------------------


def test_make_config_from_presets_experiments_and_python_values():
    cfg = api.make_config("small", {"train.lr": 3e-4, "train.profile_steps": (3, 4),
                                    "model.norm_topk_prob": False, "data.seq_len": 64})
    assert cfg.model.name == "small" and cfg.model.hidden_size == 256
    assert cfg.train.lr == 3e-4 and cfg.train.profile_steps == (3, 4)
    assert cfg.model.norm_topk_prob is False and cfg.data.seq_len == 64
    exp = api.make_config("cpt_debug", ["train.steps=70"])
    assert exp.model.name == "cpt_debug" and exp.train.steps == 70 and exp.data.seq_len == 128
    with pytest.raises(ConfigError, match="valid keys at this level"):
        api.make_config("tiny", {"train.lrr": 1})
    with pytest.raises(ConfigError, match="not a model preset"):
        api.make_config("no_such_thing")


def test_saved_config_round_trips_and_reruns_with_overrides(tmp_path):
    cfg = api.make_config("cpt_debug", {"train.steps": 110, "seed": 3})
    api.save_config(cfg, tmp_path / "config.json")
    assert api.load_config(tmp_path / "config.json") == cfg
    assert api.load_config(tmp_path) == cfg                     # a run directory works too
    again = api.make_config(tmp_path / "config.json", ["train.lr=0.5"])
    assert again.train.steps == 110 and again.seed == 3 and again.train.lr == 0.5


def test_bad_values_are_rejected_when_parsed():
    with pytest.raises(ConfigError, match="exceeds model.max_position_embeddings=4096"):
        api.make_config("tiny", ["data.seq_len=8192"])
    assert api.make_config("tiny", ["data.seq_len=8192",
                                    "model.max_position_embeddings=8192"]).data.seq_len == 8192
    with pytest.raises(ConfigError, match="multiply to 12, but there are 8 devices"):
        api.make_config("tiny", ["mesh.num_devices=8", "mesh.fsdp=3", "mesh.expert=4"])
    with pytest.raises(ConfigError, match="not divisible"):
        Config(mesh=MeshConfig(num_devices=6, expert=4))
    with pytest.raises(ConfigError, match="wandb_mode"):
        TrainConfig(wandb_mode="sometimes")
    with pytest.raises(ConfigError, match="expected an int"):
        api.make_config("tiny", ["train.profile_steps=3,x"])


def test_describe_config_lists_every_key_with_type_value_and_default():
    cfg = api.make_config("tiny", {"train.lr": 0.25})
    keys = api.config_keys(cfg)
    table = api.describe_config(cfg)
    assert len(table.splitlines()) == len(keys) + 1
    assert len(keys) > 150 and len({k.key for k in keys}) == len(keys)
    line = next(ln for ln in table.splitlines() if " train.lr " in ln)
    assert line.startswith("*") and "float" in line and "0.25" in line and "0.001" in line
    line = next(ln for ln in table.splitlines() if " train.profile_steps " in ln)
    assert "tuple[int]" in line and line.startswith(" ")
    assert re.search(r"model\.scoring\s+\{sigmoid\|softmax\}", table)


def _launch(*args):
    return subprocess.run([sys.executable, "launch.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_cli_config_rerun_show_config_and_help(tmp_path):
    api.save_config(api.make_config("cpt_debug", {"train.steps": 130}), tmp_path / "config.json")
    r = _launch("--experiment=cpt_debug", f"--config={tmp_path}/config.json",
                "--set", "train.lr=0.125", "--show_config")
    assert r.returncode == 0, r.stderr
    rows = {ln.split()[1]: ln for ln in r.stdout.splitlines()[2:] if ln.strip()}
    assert "130" in rows["train.steps"] and "0.125" in rows["train.lr"]
    assert rows["train.steps"].startswith("*") and not (tmp_path / "cpt_debug").exists()
    r = _launch("--help")                           # short: launch.py's own flags
    assert "--show_config" in r.stdout and "--sweep" in r.stdout and "--config" in r.stdout
    assert len(r.stdout.splitlines()) < 80 and "--config.train.lr" not in r.stdout
    r = _launch("--helpfull")                       # every config key, with its field's help
    assert "--config.data.seq_len" in r.stdout and "--config.train.wandb_project" in r.stdout
    assert re.search(r"--config\.rl\.steps: trainer versions to reach \[int\]", r.stdout)


# ---------------------------------------------------------------------------------------------
# URL workdirs: a fake gs:// filesystem (fsspec's in-memory one behind etils.epath)
# ---------------------------------------------------------------------------------------------


def _fake_gcs_class():
    from fsspec.implementations.memory import MemoryFileSystem

    class FakeGCS(MemoryFileSystem):
        """gs:// kept in memory (etils.epath and fsspec cache the filesystem: one class, one store)."""
        protocol = ("gs", "gcs")
        store: dict = {}
        pseudo_dirs = [""]

        def __init__(self, *args, finalize_on_close=None, **kwargs):
            super().__init__(*args, **kwargs)
    return FakeGCS


_FAKE_GCS = None


@pytest.fixture
def fake_gcs():
    """Registers the in-memory gs:// filesystem for this test; yields its store (URL -> file)."""
    global _FAKE_GCS
    import fsspec
    _FAKE_GCS = _FAKE_GCS or _fake_gcs_class()
    saved = {p: fsspec.registry.get(p) for p in ("gs", "gcs")}
    for p in ("gs", "gcs"):
        fsspec.register_implementation(p, _FAKE_GCS, clobber=True)
    _FAKE_GCS.store.clear()
    yield _FAKE_GCS.store
    _FAKE_GCS.store.clear()
    for p, cls in saved.items():
        if cls is not None:
            fsspec.register_implementation(p, cls, clobber=True)


def test_url_workdir_reaches_metric_writers_plots_and_orbax_unchanged(fake_gcs, monkeypatch):
    url = "gs://bucket/runs/exp1"
    wd = run_path(url)
    assert str(wd) == url and str(wd / "checkpoints") == url + "/checkpoints"
    with MetricsWriter(url, flush_every_s=0.0) as w:
        w.write(1, {"loss": 2.5, "ce_loss": 2.0})
        w.write(2, {"loss": 2.25, "ce_loss": 1.75, "val_loss": 1.9})
    rows = read_metrics(url)
    assert [r["step"] for r in rows] == [1, 2] and rows[1]["val_loss"] == 1.9
    assert any(k.startswith(url + "/tb/events.out.tfevents") for k in fake_gcs)
    assert not pathlib.Path("gs:").exists()               # nothing went to a local "gs:" folder
    with MetricsWriter(url) as w:                          # a resumed run appends
        w.write(3, {"loss": 2.0})
    assert [r["step"] for r in read_metrics(url)] == [1, 2, 3]

    from composer_jax.train import checkpoint, loop
    png = loop.plot_curves(wd)
    assert str(png) == url + "/plots/loss.png"
    assert fake_gcs[url + "/plots/loss.png"].getvalue()[:4] == b"\x89PNG"

    seen = {}

    class RecordingManager:
        def __init__(self, directory, options=None, item_names=None):
            seen["directory"] = directory

    monkeypatch.setattr(checkpoint.ocp, "CheckpointManager", RecordingManager)
    ck = checkpoint.Checkpointer(wd / "checkpoints", Config(), every=1, keep=1)
    assert str(seen["directory"]) == url + "/checkpoints" and str(ck.directory) == str(seen["directory"])


def test_profile_trace_is_written_under_the_workdir(fake_gcs, tmp_path):
    import jax
    import jax.numpy as jnp
    f = jax.jit(lambda x: jnp.sin(x) @ x.T)
    x = jnp.ones((64, 64))
    for wd in (tmp_path / "run", "gs://bucket/prof"):
        prof = StepProfiler(wd, steps=(2, 3))
        for step in (1, 2, 3, 4):
            prof.start(step)
            y = f(x)
            prof.stop(step, y)
            assert (prof._active is not None) == (step == 2)     # one trace over steps 2-3
        prof.close()
        assert len(prof.traces) == 1
    local = list((tmp_path / "run" / "profile").rglob("*.xplane.pb"))
    remote = [k for k in fake_gcs if k.startswith("gs://bucket/prof/profile/")
              and k.endswith(".xplane.pb")]
    assert len(local) == 1 and local[0].stat().st_size > 0 and len(remote) == 1


# ---------------------------------------------------------------------------------------------
# Multi-host auto-detection
# ---------------------------------------------------------------------------------------------


def _fake_cluster(present: bool, count: int):
    class Fake:
        name = "faketpu"
        opt_in_only_method = False

        @classmethod
        def is_env_present(cls):
            return present

        @classmethod
        def get_process_count(cls):
            return count
    return Fake


@pytest.fixture
def calls(monkeypatch):
    import jax
    got = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: got.append(kw))
    for var in ("COMPOSER_JAX_COORDINATOR", "COMPOSER_JAX_NUM_PROCESSES", "COMPOSER_JAX_PROCESS_ID",
                "COMPOSER_JAX_DISTRIBUTED", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE",
                "TPU_WORKER_HOSTNAMES", "TPU_PROCESS_ADDRESSES"):
        monkeypatch.delenv(var, raising=False)
    return got


def test_multihost_auto_detects_a_slice_and_leaves_single_hosts_alone(calls, monkeypatch):
    absent, single, slice4 = (_fake_cluster(False, 4), _fake_cluster(True, 1),
                              _fake_cluster(True, 4))
    assert multihost.detect_cluster([absent, single]) is None
    assert multihost.detect_cluster([absent, slice4]) == multihost.Cluster("faketpu", 4)
    assert multihost.initialize(cluster_types=[absent, single]) is False and calls == []
    # A multi-host slice and no flags: jax.distributed.initialize() detects everything itself.
    assert multihost.initialize(cluster_types=[slice4]) is True
    assert calls == [dict(num_processes=None, process_id=None, local_device_ids=None)]
    monkeypatch.setenv("COMPOSER_JAX_DISTRIBUTED", "0")
    assert multihost.initialize(cluster_types=[slice4]) is False and len(calls) == 1
    monkeypatch.delenv("COMPOSER_JAX_DISTRIBUTED")
    monkeypatch.setenv("SLURM_NTASKS", "2")                  # env fallback when JAX's list is empty
    assert multihost.initialize(cluster_types=[]) is True and len(calls) == 2
    # Explicit flags win and are passed through.
    assert multihost.initialize("h:1234", 2, 1, "0,1", cluster_types=[]) is True
    assert calls[-1] == dict(coordinator_address="h:1234", num_processes=2, process_id=1,
                             local_device_ids=[0, 1])
    with pytest.raises(ConfigError, match="num_processes"):
        multihost.initialize("h:1234", cluster_types=[])


def test_multihost_real_detection_finds_no_cluster_here(calls):
    assert multihost.detect_cluster() is None and multihost.initialize() is False and calls == []


# ---------------------------------------------------------------------------------------------
# W&B (optional), compilation cache, tqdm.auto
# ---------------------------------------------------------------------------------------------


def test_wandb_writer_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = api.make_config("tiny", {"train.wandb_project": "cj-test", "train.wandb_mode": "offline"})
    with MetricsWriter(tmp_path, tensorboard=False, config=cfg) as w:
        w.write(1, {"loss": 3.0, "note": "x"})
        w.write(2, {"loss": 2.5})
        run_id = w._wandb.run.id
    runs = list((tmp_path / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
    assert [r["loss"] for r in read_metrics(tmp_path)] == [3.0, 2.5]
    # Off by default: no wandb directory.
    with MetricsWriter(tmp_path / "plain", tensorboard=False, config=Config()) as w:
        w.write(1, {"loss": 1.0})
    assert not (tmp_path / "plain" / "wandb").exists()


def test_compilation_cache_is_on_by_default_under_the_cache_dir(tmp_path, monkeypatch):
    import jax
    before = jax.config.jax_compilation_cache_dir
    try:
        cfg = api.make_config("tiny", {"data.cache_dir": str(tmp_path)})
        assert api.enable_compilation_cache(cfg) == str(tmp_path / "jax_compilation")
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "jax_compilation")
        off = api.make_config("tiny", {"train.compilation_cache": False})
        assert api.enable_compilation_cache(off) is None
    finally:
        jax.config.update("jax_compilation_cache_dir", before)


def test_progress_bars_use_tqdm_auto():
    plain = [str(p.relative_to(ROOT)) for d in ("composer_jax", "experiments")
             for p in (ROOT / d).rglob("*.py")
             if re.search(r"^\s*from tqdm import|^\s*import tqdm\b", p.read_text(), re.M)]
    assert plain == []


def test_wandb_missing_is_a_clear_config_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)          # import wandb -> ImportError
    cfg = api.make_config("tiny", {"train.wandb_project": "p"})
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[wandb\]'"):
        MetricsWriter(tmp_path, tensorboard=False, config=cfg)


def test_launch_checks_the_mesh_against_the_visible_devices():
    import importlib

    import jax
    launch = importlib.import_module("launch")
    n = jax.device_count()
    with pytest.raises(ConfigError, match=f"JAX sees {n} cpu"):
        launch._check_devices(api.make_config("tiny", [f"mesh.num_devices={n + 1}"]))
    with pytest.raises(ConfigError, match="multiply to"):
        launch._check_devices(api.make_config("tiny", ["mesh.fsdp=1", f"mesh.expert={n + 1}"]))
    launch._check_devices(api.make_config("tiny"))            # fsdp=-1 fills the devices
