"""Building the model and counting its parameters without allocating them."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from composer_jax.config import ExecutionConfig, ModelConfig
from composer_jax.model.transformer import Transformer


def init_model(cfg: ModelConfig, seed: int = 0, execution: ExecutionConfig | None = None,
               init_std: float = 0.02) -> Transformer:
    """A randomly initialised model (parameters allocated on the default device).

    execution: how it computes (default `ExecutionConfig()`; from a Config: `cfg.execution`);
    init_std: std of the normal init (from a Config: `cfg.train.init_std`)."""
    return Transformer(cfg, nnx.Rngs(params=seed), execution or ExecutionConfig(), init_std)


def abstract_model(cfg: ModelConfig, execution: ExecutionConfig | None = None) -> Transformer:
    """The model with `jax.ShapeDtypeStruct` leaves: shapes and dtypes only, nothing allocated."""
    return nnx.eval_shape(lambda: Transformer(cfg, nnx.Rngs(params=0),
                                              execution or ExecutionConfig()))


def random_model_numpy(cfg: ModelConfig, seed: int = 0, std: float = 0.02,
                       execution: ExecutionConfig | None = None) -> Transformer:
    """A random model drawn with numpy, for tests and benchmarks (eager `init_model` of even the
    tiny config takes seconds on a CPU): every leaf named `weight` (RMSNorm) is one, every `bias`
    (router selection bias) zero, the rest normal(0, std), in state order from one generator."""
    rng = np.random.default_rng(seed)
    graphdef, abstract = nnx.split(abstract_model(cfg, execution))

    def leaf(path, x):
        name = [str(q.key) for q in path if hasattr(q, "key")][-1]
        if name == "weight":
            return jnp.ones(x.shape, x.dtype)
        if name == "bias":
            return jnp.zeros(x.shape, x.dtype)
        return jnp.asarray(rng.normal(0.0, std, x.shape), x.dtype)

    return nnx.merge(graphdef, jax.tree_util.tree_map_with_path(leaf, abstract))


def _is_routed_expert(path) -> bool:
    keys = [str(getattr(p, "key", p)) for p in path]
    return any(k in ("w_gate", "w_up", "w_down") for k in keys)


def count_params(cfg: ModelConfig) -> tuple[int, int]:
    """(total, active) trainable parameter counts via `jax.eval_shape` (allocates nothing).

    Counted: every `nnx.Param` — token embedding, untied LM head, all attention/FFN/norm weights,
    router weights, shared experts, routed experts and the MTP modules (cfg.mtp_depth of them; the
    MTP modules share the embedding and head, which are counted once). Not counted: the router
    selection biases (RouterBias, not trained by the optimizer).
    Active = total minus the routed experts a token does not use: each MoE layer (MTP blocks
    included) keeps num_experts_per_tok of its num_routed_experts experts.
    """
    model = abstract_model(cfg)
    state = nnx.state(model, nnx.Param)
    total = routed = 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        n = math.prod(leaf.shape)
        total += n
        if _is_routed_expert(path):
            routed += n
    unused = routed * (cfg.num_routed_experts - cfg.num_experts_per_tok) // cfg.num_routed_experts
    return total, total - unused

