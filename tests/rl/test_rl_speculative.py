"""rl_async sampling with MTP speculation (`inference.speculative=true`): a batch of episodes run
through the program's policy server (the engine service the rollout workers call) records the
same tokens, behaviour and model log-probabilities, versions and router rows as plain sampling
under the same seeds, while the drafts are both accepted and rejected; a model without an MTP head
is refused with a config error."""
import concurrent.futures

import numpy as np
import pytest

from composer_jax import registry
from composer_jax.config import SECTION_PRESETS, Config, ConfigError, EngineConfig, to_dict
from composer_jax.overrides import apply_overrides
from composer_jax.rl.jobs import Job, run_job
from composer_jax.rl.program import LocalClient
from composer_jax.rl.task_program import TaskProgram


def _parity_cfg(speculative: bool) -> Config:
    cfg = registry.get("rl_async_parity").make_config()
    cfg = apply_overrides(cfg, ["model.mtp_depth=1", "rl.max_new_tokens=10",
                                "rl.job.num_rollout_workers=8",
                                f"inference.speculative={str(speculative).lower()}"],
                          SECTION_PRESETS)
    return cfg


def _episodes(cfg: Config):
    """A rollout worker's episode batch: 2 tasks x 4 samples at once (T = 1, seeds per job)."""
    program = TaskProgram(to_dict(cfg))
    server = program.make_policy()
    server.engine.swap_weights(server.engine.state, version=0)    # the first published version
    try:
        client = LocalClient(server)
        jobs = [Job(f"g{t}", s, task, seed=1009 * t + s)
                for t, task in enumerate(program.train_tasks()[:2]) for s in range(4)]
        with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
            rollouts = list(pool.map(lambda j: run_job(program, j, client), jobs))
        return rollouts, server.engine, server.stats()
    finally:
        server.close()


@pytest.mark.slow   # ~100 s on 2 cores (three engine compiles); CI's short version of the exactness
# check is tests/inference/test_speculative.py (the engine's tokens and log-probs, spec vs plain)
def test_speculative_rollouts_equal_plain_rollouts_under_the_same_seed():
    plain, plain_eng, _ = _episodes(_parity_cfg(False))
    spec, spec_eng, stats = _episodes(_parity_cfg(True))
    assert spec_eng.cfg.draft_depth == 1 and plain_eng.cfg.draft_depth == 0
    assert not any(r.error for r in plain + spec)
    n_tokens = 0
    for a, b in zip(plain, spec):
        assert a.rollout_id == b.rollout_id and len(a.segments) == len(b.segments) == 1
        sa, sb = a.segments[0], b.segments[0]
        np.testing.assert_array_equal(sa.tokens, sb.tokens)
        np.testing.assert_array_equal(sa.trainable, sb.trainable)
        np.testing.assert_array_equal(sa.versions, sb.versions)
        np.testing.assert_allclose(sa.logprobs, sb.logprobs, atol=1e-5)        # behaviour
        np.testing.assert_allclose(sa.model_logprobs, sb.model_logprobs, atol=1e-5)
        assert sa.router_indices is not None                    # rl.router_replay: recorded
        np.testing.assert_array_equal(sa.router_indices, sb.router_indices)
        assert a.reward == b.reward
        n_tokens += sa.num_trainable
    sampled = np.concatenate([r.segments[0].logprobs[r.segments[0].trainable] for r in spec])
    assert n_tokens == 8 * 10 and (sampled < -1e-3).mean() > 0.5      # really sampled at T = 1
    # speculation ran: fewer decode steps, drafts accepted and rejected (the server reports it)
    assert spec_eng.stats["verify_rows"] > 0
    assert spec_eng.stats["decode_steps"] < plain_eng.stats["decode_steps"]
    assert 0 < stats["spec_acceptance"] < 1 and 1 < stats["spec_mean_accepted_length"] < 2


def test_speculative_needs_an_mtp_head():
    """rl_async refuses inference.speculative on a model without MTP modules once its model is
    resolved (experiments.rl.prepare), before anything is built; so does the engine."""
    from experiments.rl import prepare
    cfg = registry.get("rl_async_parity").make_config()          # the toy model: mtp_depth=0
    cfg = apply_overrides(cfg, ["inference.speculative=true"], SECTION_PRESETS)
    with pytest.raises(ConfigError, match=r"inference.speculative=true drafts 1 .*no MTP head"):
        prepare(cfg)
    with pytest.raises(ConfigError, match=r"spec_depth=2 drafts 2 .*mtp_depth=1 MTP modules"):
        EngineConfig(speculative=True, spec_depth=2).check_model(1)
    assert EngineConfig(speculative=True).draft_depth == 1
    assert EngineConfig(spec_depth=2).draft_depth == 2 and EngineConfig().draft_depth == 0
    prepare(apply_overrides(cfg, ["model.mtp_depth=1"], SECTION_PRESETS))    # has its MTP head
