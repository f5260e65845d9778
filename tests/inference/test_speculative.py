"""Speculative decoding with MTP drafts: greedy equals plain greedy; sampling follows the base
model's distribution (seeded chi-square tests, on the pure acceptance rule and end to end)."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy import stats

from composer_jax.config import tiny
from composer_jax.inference import Engine, EngineConfig, SamplingParams
from composer_jax.inference.speculative import accept

from inference_testlib import ENGINE, MAX_LEN, init_model, log_softmax, make_copy_head, tiny2

PROMPTS = [[7] * 9, [3, 14, 15, 92, 65], [35, 89], list(range(100, 113)), [5, 5, 5]]


def _run(graphdef, state, cfg, prompts, params):
    eng = Engine(graphdef, state, cfg)
    ids = [eng.submit(p, params) for p in prompts]
    done = eng.run()
    return [done[i] for i in ids], eng


@pytest.mark.parametrize("depth", [2, pytest.param(1, marks=pytest.mark.slow)])
def test_speculative_greedy_equals_plain_greedy(depth):
    model = make_copy_head(tiny2())
    # tokens tend to predict themselves, so greedy text often repeats and the copy drafts hit
    model.lm_head.value = model.embed.value.T * 0.6 + model.lm_head.value
    graphdef, state = nnx.split(model)
    params = SamplingParams(temperature=0.0, max_new_tokens=12)
    plain, plain_eng = _run(graphdef, state, ENGINE, PROMPTS, params)
    spec, eng = _run(graphdef, state, dataclasses.replace(ENGINE, spec_depth=depth), PROMPTS,
                     params)
    for a, b in zip(plain, spec):
        assert a.tokens == b.tokens
        np.testing.assert_allclose(a.raw_logprobs, b.raw_logprobs, atol=1e-5)
        assert b.logprobs == [0.0] * 12
    m = eng.speculation_metrics()
    assert len(m["acceptance_per_depth"]) == depth
    assert 0 < m["acceptance_per_depth"][0] < 1      # both accepted and rejected drafts occurred
    assert 1 < m["mean_accepted_length"] <= depth + 1
    assert eng.stats["decode_steps"] < plain_eng.stats["decode_steps"]   # fewer steps than plain


def _chi2_pvalue(counts, probs):
    probs = np.asarray(probs, np.float64) / np.sum(probs, dtype=np.float64)
    keep = probs * counts.sum() >= 5                   # pool rare cells
    obs = np.append(counts[keep], counts[~keep].sum())
    exp = np.append(probs[keep], probs[~keep].sum()) * counts.sum()
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return stats.chisquare(obs, exp).pvalue


def test_accept_counts_the_matching_draft_prefix():
    drafts = jnp.asarray([[4, 5], [4, 5], [9, 5], [4, 9]], jnp.int32)
    targets = jnp.asarray([[4, 5, 1], [4, 6, 1], [4, 5, 1], [4, 5, 1]], jnp.int32)
    assert np.asarray(accept(drafts, targets)).tolist() == [2, 1, 0, 1]


@pytest.mark.parametrize("depth", [2, pytest.param(1, marks=pytest.mark.slow)])
def test_speculative_sampling_reproduces_plain_sampling_under_the_same_seed(depth):
    """Sampling (temperature, top-k, top-p): the speculative engine emits exactly the tokens plain
    decoding emits with the same seeds, with the same behaviour and model log-probabilities,
    while drafts are both accepted and rejected."""
    model = make_copy_head(tiny2())
    model.lm_head.value = model.embed.value.T * 0.6 + model.lm_head.value * 20.0
    graphdef, state = nnx.split(model)
    params = [SamplingParams(temperature=t, top_k=k, top_p=p, max_new_tokens=12, seed=i)
              for i, (t, k, p) in enumerate([(1.0, 0, 1.0), (0.7, 5, 1.0), (1.0, 0, 0.9),
                                             (1.3, 0, 1.0), (0.0, 0, 1.0)])]
    plain_eng = Engine(graphdef, state, ENGINE)
    spec_eng = Engine(graphdef, state, dataclasses.replace(ENGINE, spec_depth=depth))
    results = []
    for eng in (plain_eng, spec_eng):
        ids = [eng.submit(p, q) for p, q in zip(PROMPTS, params)]
        done = eng.run()
        results.append([done[i] for i in ids])
    for a, b in zip(*results):
        assert a.tokens == b.tokens
        assert len(a.tokens) == 12
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
        np.testing.assert_allclose(a.raw_logprobs, b.raw_logprobs, atol=1e-5)
    assert any(x < 0 for c in results[1] for x in c.logprobs)     # really sampled, not greedy
    m = spec_eng.speculation_metrics()
    assert 0 < m["acceptance_per_depth"][0] < 1
    assert spec_eng.stats["decode_steps"] < plain_eng.stats["decode_steps"]


def _spec_sampling_case(n_requests: int):
    cfg = dataclasses.replace(tiny(), vocab_size=8, mtp_depth=2)
    model = make_copy_head(cfg, seed=1)
    # sharper distributions than the default init: larger LM head
    model.lm_head.value = model.lm_head.value * 60.0
    graphdef, state = nnx.split(model)
    prompt = [1, 2]
    params = SamplingParams(temperature=1.0, top_k=6, max_new_tokens=3)
    eng = Engine(graphdef, state, EngineConfig(max_batch=n_requests, max_len=16,
                                               max_queue=n_requests, spec_depth=2,
                                               prefill_batch=n_requests,
                                               max_finished=n_requests))
    ids = [eng.submit(prompt, dataclasses.replace(params, seed=i)) for i in range(n_requests)]
    done = eng.run()
    seqs = np.array([done[i].tokens for i in ids])
    # exact distributions of the base model under the same sampling parameters
    fwd = jax.jit(lambda st, t: nnx.merge(graphdef, st)(t, with_mtp=False).logits)
    pairs = np.array([[a, b] for a in range(8) for b in range(8)])
    ctx = np.concatenate([np.tile(prompt, (64, 1)), pairs], 1)
    logits = np.asarray(fwd(state, jnp.asarray(ctx)))

    def processed(lg):
        lp = log_softmax(lg)
        cut = np.sort(lp, -1)[..., -6][..., None]
        lp = np.where(lp >= cut, lp, -np.inf)
        return np.exp(log_softmax(lp))

    p1 = processed(logits[0, 1])                       # t1 | prompt
    p2 = processed(logits[::8, 2])                     # t2 | prompt, t1   [8, 8]
    p3 = processed(logits[:, 3])                       # t3 | prompt, t1, t2   [64, 8]
    joint12 = (p1[:, None] * p2).reshape(-1)
    marg3 = (joint12[:, None] * p3).sum(0)
    return eng, seqs, joint12, marg3


@pytest.mark.parametrize("n", [1024, pytest.param(8192, marks=pytest.mark.slow)])
def test_speculative_sampling_matches_base_distribution(n):
    eng, seqs, joint12, marg3 = _spec_sampling_case(n)
    c12 = np.bincount(seqs[:, 0] * 8 + seqs[:, 1], minlength=64)
    c3 = np.bincount(seqs[:, 2], minlength=8)
    assert _chi2_pvalue(c12, joint12) > 1e-3
    assert _chi2_pvalue(c3, marg3) > 1e-3
    tv = 0.5 * np.abs(c12 / n - joint12).sum()
    assert tv < 2.5 * np.sqrt(64 / n)
    m = eng.speculation_metrics()
    assert 0 < m["acceptance_per_depth"][0] < 1     # the rejection path was exercised


def _teacher_forced_counts(mtp_argmax, seq, prompt_len, n_new, depth):
    """(accepted, attempted) per draft depth that greedy speculation must reach if every draft is
    the MTP modules' own prediction: mtp_argmax [Dm,T] from the training forward over the greedy
    text seq (module k at position t predicts token t+k+2), visiting the positions a speculative
    run visits (pending token q, drafts for q+1.. from position q-1; n_acc+1 tokens per step)."""
    acc, att = np.zeros(depth, int), np.zeros(depth, int)
    q = prompt_len
    while q - prompt_len + 1 < n_new:
        n_acc = 0
        while n_acc < depth and mtp_argmax[n_acc][q - 1] == seq[q + 1 + n_acc]:
            n_acc += 1
        att[:min(n_acc + 1, depth)] += 1
        acc[:n_acc] += 1
        q += n_acc + 1
    return acc, att


@pytest.mark.parametrize("depth", [1, 2])
def test_draft_acceptance_equals_the_trained_mtp_heads_teacher_forced(depth):
    """Drafts are what the MTP modules predict in training (the forward over the whole text), not
    just exact-but-worse guesses: the engine's accepted/attempted counts per depth equal those of
    a simulation from the training forward's mtp_logits. The MTP blocks' attention is live here
    (the copy head's attention output restored to random weights), so a stale or missing MTP
    cache entry changes the counts."""
    model = make_copy_head(tiny2())
    model.lm_head.value = model.embed.value.T * 0.6 + model.lm_head.value   # repetitive text
    live = init_model(tiny2(), seed=9, std=0.2)
    model.mtp.block.attn.wo.value = live.mtp.block.attn.wo.value
    graphdef, state = nnx.split(model)
    n_new = 16
    prompts = [[1, 2, 3, 4, 5], [7] * 6, [3, 1, 4, 1, 5, 9, 2, 6], [2, 11]]
    plain, _ = _run(graphdef, state, ENGINE, prompts,
                    SamplingParams(temperature=0.0, max_new_tokens=n_new + depth + 1))
    _, eng = _run(graphdef, state, dataclasses.replace(ENGINE, spec_depth=depth), prompts,
                  SamplingParams(temperature=0.0, max_new_tokens=n_new))
    fwd = jax.jit(lambda st, t: nnx.merge(graphdef, st)(t).mtp_logits[:, 0])
    want_acc, want_att = np.zeros(depth, int), np.zeros(depth, int)
    for p, c in zip(prompts, plain):
        seq = p + c.tokens
        padded = jnp.asarray([seq + [0] * (MAX_LEN - len(seq))], jnp.int32)
        am = np.argmax(np.asarray(fwd(state, padded)), -1)          # [Dm, T]
        a, t = _teacher_forced_counts(am, seq, len(p), n_new, depth)
        want_acc += a
        want_att += t
    assert eng.accepted_at_depth.tolist() == want_acc.tolist()
    assert eng.attempted_at_depth.tolist() == want_att.tolist()
    assert 0 < want_acc[-1] < want_att[-1]          # the deepest draft both hit and missed
