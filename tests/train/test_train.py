"""The pretraining stack: pure losses, the train step, the NaN guard, and exact resume."""
import dataclasses
import sysconfig

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from composer_jax.config import Config, MTPLoss, TrainConfig, tiny
from composer_jax.data.config import DataConfig
from composer_jax.model import abstract_model, init_model
from composer_jax.runlog import read_metrics
from composer_jax.train import losses
from composer_jax.train.step import build, build_fns


def test_cross_entropy_matches_optax():
    logits = jax.random.normal(jax.random.key(0), (2, 5, 11))
    t = jax.random.randint(jax.random.key(1), (2, 5), 0, 11)
    mask = jnp.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], jnp.float32)
    ref = (optax.softmax_cross_entropy_with_integer_labels(logits, t) * mask).sum()
    np.testing.assert_allclose(losses.cross_entropy_sum(logits, t, mask), ref, rtol=1e-6)


def test_self_distill_is_zero_for_a_perfect_student_and_positive_otherwise():
    main = jax.random.normal(jax.random.key(0), (2, 6, 7))
    mask = jnp.ones((2, 1, 6))
    perfect = losses.shift_left(main, 1)[None]          # depth 1 sees the main head at i+1
    assert float(losses.mtp_self_distill_sums(perfect, main, mask.at[:, :, -1].set(0))[0]) < 1e-5
    other = jax.random.normal(jax.random.key(1), (1, 2, 6, 7))
    assert float(losses.mtp_self_distill_sums(other, main, mask)[0]) > 0.1


def _batch(b=4, t=16, v=256, d=1, seed=0):
    rng = np.random.default_rng(seed)
    toks = rng.integers(0, v, (b, t)).astype(np.int32)
    tgt = np.roll(toks, -1, 1)
    m = np.ones((b, t), np.float32)
    m[:, -1] = 0
    return dict(tokens=toks, positions=np.tile(np.arange(t, dtype=np.int32), (b, 1)),
                segment_ids=np.ones((b, t), np.int32), targets=tgt, loss_mask=m,
                mtp_targets=np.roll(toks, -2, 1)[:, None].repeat(d, 1),
                mtp_mask=np.concatenate([m[:, None, 1:], np.zeros((b, 1, 1), np.float32)], -1))


def test_sharded_init_equals_eager_init():
    """The one-program init that creates a fresh state straight into its shardings (used for big
    or multi-host runs) gives exactly the eager init's parameters and optimizer state."""
    from composer_jax.train.loop import training_mesh
    cfg = Config(model=tiny(), data=DataConfig(global_batch_size=4, vocab_size=512),
                 train=TrainConfig(steps=10, warmup_steps=0))
    mesh = training_mesh(cfg)
    fresh = build_fns(abstract_model(cfg.model), cfg, mesh).init_state(cfg)
    _, eager = build(init_model(cfg.model, cfg.seed), cfg, mesh)
    leaves = jax.tree.leaves(fresh)
    assert len(leaves) == len(jax.tree.leaves(eager)) > 50
    for a, b in zip(leaves, jax.tree.leaves(eager)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert all(x.sharding.mesh.shape == mesh.shape for x in jax.tree.leaves(fresh.params))


@pytest.mark.parametrize("mtp", [MTPLoss.SUPERVISED, MTPLoss.SELF_DISTILL])
def test_microbatching_matches_full_batch(mtp):
    base = Config(model=tiny(), train=TrainConfig(steps=10, warmup_steps=0, mtp_loss=mtp),
                  data=DataConfig(global_batch_size=4, vocab_size=512))
    micro = dataclasses.replace(base, train=dataclasses.replace(base.train, microbatches=2))
    b = _batch()
    out = []
    for cfg in (base, micro):
        fns, state = build(init_model(cfg.model), cfg)
        state, m = fns.train_step(state, b)
        out.append((state, m))
    np.testing.assert_allclose(out[0][1]["loss"], out[1][1]["loss"], rtol=1e-5)
    np.testing.assert_allclose(out[0][1]["grad_norm"], out[1][1]["grad_norm"], rtol=1e-4)
    # Adam's first step is ~lr * sign(g): float-rounding differences in near-zero gradient
    # entries move a few elements by a fraction of lr (1e-3), never by a whole step.
    for a, c in zip(jax.tree.leaves(out[0][0].params), jax.tree.leaves(out[1][0].params)):
        np.testing.assert_allclose(a, c, atol=1e-4)


def test_router_bias_moves_and_is_not_an_optimizer_parameter():
    cfg = Config(model=tiny(), train=TrainConfig(steps=10, warmup_steps=0),
                 data=DataConfig(global_batch_size=4, vocab_size=512))
    fns, state = build(init_model(cfg.model), cfg)
    assert "bias" not in str(jax.tree_util.tree_structure(state.params))
    before = np.asarray(state.buffers["moe_layers"]["ffn"]["bias"])
    state, m = fns.train_step(state, _batch())
    after = np.asarray(state.buffers["moe_layers"]["ffn"]["bias"])
    # each bias moves by exactly +-rate (or 0 for an expert exactly at the mean load)
    step = np.abs(after - before)
    assert np.all(np.isclose(step, cfg.train.router_bias_update_rate) | (step == 0))
    assert np.any(step > 0)
    assert float(m["expert_load_max_over_mean"]) >= 1.0


def test_nonfinite_guard_skips_update():
    cfg = Config(model=tiny(), train=TrainConfig(steps=10, warmup_steps=0),
                 data=DataConfig(global_batch_size=4, vocab_size=512))
    fns, state = build(init_model(cfg.model), cfg)
    poisoned = jax.tree.map(lambda x: x, state.params)
    poisoned["final_norm"]["weight"] = poisoned["final_norm"]["weight"].at[0].set(jnp.nan)
    state = state.replace(params=poisoned)
    before = jax.tree.map(np.asarray, state.params)
    state, m = fns.train_step(state, _batch())
    assert float(m["update_skipped"]) == 1.0 and int(state.nonfinite_streak) == 1
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(state.params)):
        np.testing.assert_array_equal(a, b)


def _tiny_run_config(steps: int) -> Config:
    model = dataclasses.replace(tiny(), vocab_size=512)
    data = DataConfig(source_roots=(sysconfig.get_paths()["stdlib"],), max_files=40,
                      validation_fraction=0.1, vocab_size=512, seq_len=64, global_batch_size=4,
                      tokenizer_train_bytes=400_000, progress=False)
    train = TrainConfig(steps=steps, lr=3e-3, warmup_steps=2, log_every=2, eval_every=4,
                        eval_batches=2, checkpoint_every=2, keep_checkpoints=2)
    return Config(model=model, data=data, train=train)


def test_interrupted_run_resumes_bitwise(tmp_path):
    from composer_jax.train.loop import train

    cfg = _tiny_run_config(steps=6)
    full = train(cfg, tmp_path / "full")
    part = train(cfg, tmp_path / "resumed", interrupt_at=3)
    assert int(part.state.step) == 3
    resumed = train(cfg, tmp_path / "resumed")
    assert int(resumed.state.step) == 6
    for a, b in zip(jax.tree.leaves(full.state), jax.tree.leaves(resumed.state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    rows = read_metrics(tmp_path / "full")
    assert all(np.isfinite(r["loss"]) for r in rows)
    assert (tmp_path / "full" / "plots" / "loss.png").exists()
    assert (tmp_path / "full" / "tb").is_dir()


def test_checkpoint_from_another_config_is_refused(tmp_path):
    from composer_jax.errors import CheckpointError
    from composer_jax.train.loop import train

    cfg = _tiny_run_config(steps=2)
    train(cfg, tmp_path)
    other = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, hidden_size=32))
    with pytest.raises(CheckpointError, match="different model config"):
        train(other, tmp_path)
    # execution choices do not change what the weights mean: a resume may change them
    remat = dataclasses.replace(cfg, execution=dataclasses.replace(cfg.execution, remat="full",
                                                                   attention_kv_block=16))
    assert int(train(remat, tmp_path).state.step) == 2


def test_corrupted_latest_checkpoint_falls_back(tmp_path, capsys):
    from composer_jax.train.loop import train

    cfg = _tiny_run_config(steps=4)
    train(cfg, tmp_path)
    ckpts = sorted((tmp_path / "checkpoints").iterdir(), key=lambda p: p.name)
    latest = [p for p in ckpts if p.name.isdigit()][-1]
    for f in (latest / "state").rglob("*"):
        if f.is_file():
            f.write_bytes(b"garbage")
    longer = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, steps=4))
    out = train(longer, tmp_path)
    assert "falling back" in capsys.readouterr().err
    assert int(out.state.step) == 4


def test_resume_drops_rows_past_the_checkpoint_and_a_finished_rerun_changes_nothing(tmp_path,
                                                                                  capsys):
    """A run killed after logging past its last checkpoint: the resumed run drops those rows from
    metrics.jsonl and tb/ (one row per step, ascending, one event file), and rerunning the
    finished run says so and leaves every file as it was."""
    import hashlib
    import shutil

    from composer_jax.train.loop import train

    cfg = _tiny_run_config(steps=6)
    train(cfg, tmp_path)
    full = [r["step"] for r in read_metrics(tmp_path)]
    shutil.rmtree(tmp_path / "checkpoints" / "6")          # as if killed before saving step 6
    out = train(cfg, tmp_path)
    assert "resumed from" in capsys.readouterr().out and int(out.state.step) == 6
    steps = [r["step"] for r in read_metrics(tmp_path)]
    assert steps == sorted(set(steps)) and set(full) <= set(steps)   # (+ the first resumed step)
    assert len(list((tmp_path / "tb").glob("events.out.tfevents*"))) == 1

    def digest():
        return {str(f.relative_to(tmp_path)): hashlib.sha256(f.read_bytes()).hexdigest()
                for f in sorted(tmp_path.rglob("*")) if f.is_file()}
    before = digest()
    again = train(cfg, tmp_path)
    assert again.already_finished and "already finished at step 6" in capsys.readouterr().out
    assert digest() == before
