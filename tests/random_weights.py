"""Random model weights built with numpy (fast, no jitted init), shared by the agent and eval tests."""
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from composer_jax.model import abstract_model


def random_params(cfg, seed: int):
    """(graphdef, state) of a model for `cfg`: normal(0, 0.02) weights, norm scales one, biases zero."""
    rng = np.random.default_rng(seed)
    graphdef, abstract = nnx.split(abstract_model(cfg))

    def leaf(path, x):
        name = [str(q.key) for q in path if hasattr(q, "key")][-1]
        if name in ("weight", "bias"):
            return (jnp.ones if name == "weight" else jnp.zeros)(x.shape, x.dtype)
        return jnp.asarray(rng.normal(0.0, 0.02, x.shape), x.dtype)

    return graphdef, jax.tree_util.tree_map_with_path(leaf, abstract)
