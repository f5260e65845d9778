"""An RL run is a first-class artifact (issue 26): a real `launch.py --experiment=rl_async` run is
read through every consumer of a run's weights (the one checkpoint reader, `generate`, `eval`'s
policy loader, HF export, `train.init_from`), stopped cleanly by SIGTERM and by SIGINT, SIGKILLed
and resumed with exactly one metrics row (and one TensorBoard point) per version, and a finished
run's rerun changes nothing."""
import hashlib
import json
import os
import pathlib
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
SMALL = ["rl.job.checkpoint_every=2", "rl.job.eval_every=4", "rl.batch_groups=2",
         "rl.group_size=2", "rl.job.num_rollout_workers=4", "rl.task.num_train_tasks=8",
         "rl.task.num_eval_tasks=2"]


def _cmd(workdir, *sets, experiment="rl_async_parity"):
    cmd = [sys.executable, str(ROOT / "launch.py"), f"--experiment={experiment}",
           f"--workdir={workdir}"]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def _train_rows(workdir) -> list[dict]:
    path = pathlib.Path(workdir) / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:       # a line being written
            pass
    return [r for r in rows if "reward_mean" in r]


def _tb_steps(workdir, tag: str) -> list[int]:
    """The steps of scalar `tag` in every event file under WORKDIR/tb (TFRecord framing)."""
    from tensorboardX.proto import event_pb2
    steps = []
    for f in sorted((pathlib.Path(workdir) / "tb").glob("events.out.tfevents*")):
        data = f.read_bytes()
        i = 0
        while i + 12 <= len(data):
            (n,) = struct.unpack("<Q", data[i:i + 8])
            ev = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
            i += 12 + n + 4
            steps += [ev.step for v in ev.summary.value if v.tag == tag]
    return steps


@pytest.fixture(scope="module")
def rl_run(tmp_path_factory):
    """A finished 4-version rl_async run (checkpoints at versions 2 and 4)."""
    work = tmp_path_factory.mktemp("rl_run")
    p = subprocess.run(_cmd(work, "rl.steps=4", *SMALL), cwd=ROOT, capture_output=True,
                       text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    return work, p


def test_run_writes_meta_tokenizer_and_a_short_summary(rl_run):
    work, p = rl_run
    from composer_jax.train.run_checkpoint import checkpoint_steps, read_meta
    assert checkpoint_steps(work) == [0, 2, 4]     # version 0 and every eval_every-th are kept
    meta = read_meta(work, 4)
    assert meta["kind"] == "rl" and meta["model"]["name"] == "tiny_toy" and meta["version"] == 4
    assert (work / "tokenizer.json").is_file() and (work / "prompts.json").is_file()
    lines = p.stdout.strip().splitlines()
    assert lines[-4].startswith("rl_async: 4/4 versions, 16 rollouts in ")
    assert "train reward" in lines[-3] and "held-out reward" in lines[-3]
    assert f"checkpoint {work / 'checkpoints' / '4'}" in lines[-2]
    assert "reward=nan" not in p.stderr
    s = json.loads((work / "rl_summary.json").read_text())
    assert s["version"] == 4 and s["rollouts_trained"] == 4 * 2 * 2 and s["finished"]
    assert sorted(s["eval"], key=int) == ["0", "4"]


def test_every_consumer_reads_the_rl_checkpoint(rl_run, tmp_path):
    work, _ = rl_run
    import jax

    from composer_jax.config import Config
    from composer_jax.eval.policies import make_policy
    from composer_jax.train.weights import load_weights

    cfg = Config()
    newest, at2 = load_weights(str(work), cfg), load_weights(f"{work}@2", cfg)
    assert newest.kind == "run" and newest.step == 4 and at2.step == 2
    assert newest.model_cfg.name == "tiny_toy" and newest.tokenizer_path == work / "tokenizer.json"
    fresh = load_weights("", dataclasses_replace_model(cfg, newest.model_cfg))
    d_trained = [float(np.abs(a - b).max()) for a, b in
                 zip(jax.tree.leaves(newest.params), jax.tree.leaves(at2.params))]
    d_fresh = [float(np.abs(np.asarray(a) - b).max()) for a, b in
               zip(jax.tree.leaves(fresh.params), jax.tree.leaves(at2.params))]
    assert max(d_trained) > 0 and max(d_fresh) > 0       # versions 2 and 4 are trained weights
    with pytest.raises(Exception, match="no checkpoint at step 3"):
        load_weights(f"{work}@3", cfg)

    policy = make_policy(f"{work}@4", cfg, max_new_tokens=4, max_context=64, concurrency=1)
    try:
        assert policy.name == f"{work.name}@4" and policy.describe()["step"] == 4
    finally:
        policy.close()

    # HF export of the RL checkpoint, read back bit for bit (with the run's tokenizer beside it)
    p = subprocess.run(_cmd(tmp_path / "export", f"train.init_from={work}",
                            experiment="model_check"), cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    hf = load_weights(str(tmp_path / "export" / "hf"), cfg)
    assert (tmp_path / "export" / "hf" / "tokenizer.json").is_file()
    for a, b in zip(jax.tree.leaves(hf.params), jax.tree.leaves(newest.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    # generate: decoded text by default, the ids only behind the flag
    p = subprocess.run(_cmd(tmp_path / "gen", f"train.init_from={work}", "eval.max_new_tokens=4",
                            experiment="generate"), cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"loaded {work} at step 4 (tiny_toy" in p.stdout
    assert "completion: '" in p.stdout and "<|im_assistant|>" in p.stdout
    assert "completion ids" not in p.stdout


def dataclasses_replace_model(cfg, model):
    import dataclasses
    return dataclasses.replace(cfg, model=model)


def test_train_init_from_an_rl_run(rl_run):
    """cpt/sft `train.init_from=RL_WORKDIR@2`: the training loop's own path (`loop._build`, then
    `load_weights(..., template=state)` into the placed TrainState) yields the RL policy's
    weights exactly; a model of another architecture is refused with a message that says so."""
    import jax

    from composer_jax.config import Config, TrainConfig
    from composer_jax.errors import CheckpointError
    from composer_jax.train.loop import _build, training_mesh
    from composer_jax.train.weights import load_weights

    work, _ = rl_run
    src = load_weights(f"{work}@2", Config())
    cfg = Config(model=src.model_cfg, train=TrainConfig(init_from=f"{work}@2"))
    _, state = _build(cfg, training_mesh(cfg))
    w = load_weights(cfg.train.init_from, cfg, template=state)
    assert w.step == 2
    for a, b, t in zip(jax.tree.leaves(w.params), jax.tree.leaves(src.params),
                       jax.tree.leaves(state.params)):
        assert a.sharding == t.sharding                 # restored into the template's placement
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    other = Config()                                    # `tiny`: another vocabulary
    _, state2 = _build(other, training_mesh(other))
    with pytest.raises(CheckpointError, match="another architecture"):
        load_weights(f"{work}@2", other, template=state2)


def test_rerunning_a_finished_run_changes_nothing(rl_run):
    work, _ = rl_run

    def digest():
        return {str(f.relative_to(work)): hashlib.sha256(f.read_bytes()).hexdigest()
                for f in sorted(work.rglob("*")) if f.is_file()}
    before = digest()
    p = subprocess.run(_cmd(work, "rl.steps=4", *SMALL), cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "already finished at version 4" in p.stdout
    assert digest() == before


def _start(work, steps, *extra):
    return subprocess.Popen(_cmd(work, f"rl.steps={steps}", *SMALL, *extra), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_rows(proc, work, n, timeout=600):
    deadline = time.monotonic() + timeout
    while len(_train_rows(work)) < n:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the run made no progress"
        time.sleep(0.2)


def _stop_with(proc, work, sig, n_rows):
    from composer_jax.train.run_checkpoint import checkpoint_steps
    _wait_rows(proc, work, n_rows)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    name = signal.Signals(sig).name
    s = json.loads((work / "rl_summary.json").read_text())
    assert s["stopped_by"] == name and not s["finished"]
    assert checkpoint_steps(work)[-1] == s["version"] >= n_rows
    assert f"stopped by {name}" in out and "Traceback" not in err
    for f in ("reward.png", "staleness.png", "throughput.png"):
        assert (work / "plots" / f).is_file()
    return s["version"]


def test_sigterm_stops_cleanly_and_the_rerun_resumes(tmp_path):
    """The CI version: SIGTERM during a run exits 0 with a checkpoint, plots and the summary; the
    rerun resumes from that checkpoint and finishes with one trainer row per version."""
    work = tmp_path / "run"
    v = _stop_with(_start(work, 400), work, signal.SIGTERM, 2)
    p = subprocess.run(_cmd(work, f"rl.steps={v + 2}", *SMALL), cwd=ROOT, capture_output=True,
                       text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"resumed at version {v}" in p.stderr
    assert [r["step"] for r in _train_rows(work)] == list(range(1, v + 3))
    assert _tb_steps(work, "reward_mean") == list(range(1, v + 3))


@pytest.mark.slow
def test_sigterm_sigint_sigkill_and_resume(tmp_path):
    """SIGTERM, then SIGINT on the resumed run: each exits 0 with a checkpoint of the version it
    reached, plots and a summary. Then a SIGKILL and a rerun to the end: metrics.jsonl and
    TensorBoard hold exactly one trainer row per version 1..N, and the summary counts the whole
    run."""
    from composer_jax.train.run_checkpoint import checkpoint_steps
    work = tmp_path / "run"
    v1 = _stop_with(_start(work, 400), work, signal.SIGTERM, 3)
    proc = _start(work, 400)
    v2 = _stop_with(proc, work, signal.SIGINT, v1 + 2)
    assert v2 > v1
    proc = _start(work, 400)
    _wait_rows(proc, work, v2 + 3)
    proc.kill()
    proc.wait()
    killed_rows = len(_train_rows(work))
    resumed = checkpoint_steps(work)[-1]
    n = resumed + 2
    p = subprocess.run(_cmd(work, f"rl.steps={n}", *SMALL), cwd=ROOT, capture_output=True,
                       text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"resumed at version {resumed}" in p.stderr and killed_rows > resumed
    steps = [r["step"] for r in _train_rows(work)]
    assert steps == list(range(1, n + 1))
    assert _tb_steps(work, "reward_mean") == list(range(1, n + 1))
    assert len(list((work / "tb").glob("events.out.tfevents*"))) == 1
    s = json.loads((work / "rl_summary.json").read_text())
    assert s["version"] == n and s["rollouts_trained"] == n * 2 * 2 and s["finished"]
    assert sum(s["staleness_hist"].values()) == n * 2 * 2
    assert s["elapsed_s"] > s["segment"]["elapsed_s"]
