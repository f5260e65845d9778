"""The sampler's greedy fast path and the engine's on-device parameters: the speed-ups of the
decode step must not change a token."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from composer_jax.inference import Engine, SamplingParams
from composer_jax.inference.sampling import (SamplerArrays, all_greedy, gumbel_sample, keys_at,
                                             processed_logprobs, sample_at)

from inference_testlib import ENGINE

B, V = 6, 257


def _logp(temperature, seed=0):
    rng = np.random.default_rng(seed)
    logits = jnp.asarray(rng.normal(0, 3, (B, V)), jnp.float32)
    logits = logits.at[1, 7].set(logits[1].max()).at[1, 9].set(logits[1].max())   # a tie
    t = jnp.asarray(temperature, jnp.float32)
    return logits, processed_logprobs(logits, t, jnp.zeros(B, jnp.int32), jnp.ones(B))


def test_greedy_branch_is_the_gumbel_token_of_a_point_mass():
    logits, logp = _logp([0.0] * B)
    key_data = jax.random.key_data(jax.random.split(jax.random.key(3), B))
    index = jnp.arange(B, dtype=jnp.int32) * 5
    fast = np.asarray(sample_at(logp, key_data, index, jnp.bool_(True)))
    slow = np.asarray(gumbel_sample(logp, keys_at(key_data, index)))
    np.testing.assert_array_equal(fast, slow)
    np.testing.assert_array_equal(fast, np.argmax(np.asarray(logits), -1))
    assert fast[1] == 7                                     # the first of tied maxima


def test_mixed_batch_samples_and_greedy_rows_stay_argmax():
    temps = [0.0, 1.0, 0.0, 1.0, 1.0, 0.0]
    logits, logp = _logp(temps, seed=1)
    sp = SamplerArrays.build([SamplingParams(temperature=t) for t in temps])
    assert isinstance(sp.temperature, np.ndarray) and not bool(all_greedy(sp))
    key_data = jax.random.key_data(jax.random.split(jax.random.key(4), B))
    draws = [np.asarray(sample_at(logp, key_data, jnp.full(B, i, jnp.int32), all_greedy(sp)))
             for i in range(40)]
    greedy_rows = [0, 2, 5]
    for d in draws:
        np.testing.assert_array_equal(d[greedy_rows], np.argmax(np.asarray(logits), -1)[greedy_rows])
    sampled = np.stack(draws)[:, [1, 3, 4]]
    assert all(len(set(sampled[:, j])) > 3 for j in range(3))     # the noise is really drawn
    ref = gumbel_sample(logp, keys_at(key_data, jnp.full(B, 7, jnp.int32)))
    np.testing.assert_array_equal(draws[7], np.asarray(ref))


def test_engine_places_host_parameters_on_device_with_the_same_tokens(split):
    graphdef, state = split
    host_state = jax.tree.map(np.asarray, state)            # what a loaded checkpoint gives
    cfg = dataclasses.replace(ENGINE)
    sps = [SamplingParams(temperature=0.0, max_new_tokens=6),
           SamplingParams(temperature=0.8, max_new_tokens=6, seed=11)]
    out = []
    for s in (state, host_state):
        eng = Engine(graphdef, s, cfg)
        assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(eng.state))
        ids = [eng.submit([5, 6, 7, 8], sp) for sp in sps]
        done = eng.run()
        out.append([(done[i].tokens, done[i].logprobs) for i in ids])
        eng.swap_weights(host_state, version=1)
        eng.submit([1, 2], sps[0])
        eng.run()
        assert eng.version == 1
        assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(eng.state))
    assert [t for t, _ in out[0]] == [t for t, _ in out[1]]
    for (_, a), (_, b) in zip(*out):
        np.testing.assert_allclose(a, b, atol=1e-6)
