"""Shared fixtures: one tiny model (MTP depth 2) for every engine test, so each step function
compiles once per shape; engines use the same slot count and context so they share compilations."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from inference_testlib import MAX_LEN, init_model, tiny2


@pytest.fixture(scope="session")
def model():
    return init_model(tiny2(), seed=0)


@pytest.fixture(scope="session")
def split(model):
    return nnx.split(model)


@pytest.fixture(scope="session")
def full_logits(split):
    """(state, tokens list) -> full-forward logits [len, V] (padded to MAX_LEN: compiles once)."""
    graphdef, _ = split

    @jax.jit
    def fwd(state, tokens, replay):
        return nnx.merge(graphdef, state)(tokens, router_replay=replay, with_mtp=False).logits[0]

    @jax.jit
    def fwd_free(state, tokens):
        return nnx.merge(graphdef, state)(tokens, with_mtp=False).logits[0]

    def run(state, tokens, replay=None):
        n = len(tokens)
        padded = jnp.asarray([list(tokens) + [0] * (MAX_LEN - n)], jnp.int32)
        if replay is None:
            return np.asarray(fwd_free(state, padded))[:n]
        rep = np.zeros((replay.shape[0], 1, MAX_LEN, replay.shape[-1]), np.int32)
        rep[:, 0, :n] = replay
        return np.asarray(fwd(state, padded, jnp.asarray(rep)))[:n]

    return run
