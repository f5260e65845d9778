"""Helpers shared by the inference tests (imported as a plain module; tests/ is not a package)."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from composer_jax.config import tiny
from composer_jax.inference import EngineConfig
from composer_jax.model.params import random_model_numpy

MAX_LEN = 64
ENGINE = EngineConfig(max_batch=4, max_len=MAX_LEN, max_queue=16, capture_router=True)


def tiny2():
    return dataclasses.replace(tiny(), mtp_depth=2)


def leaf_name(path) -> str:
    """The parameter's own name in a state path (the last dict key, before `.value`)."""
    return [str(p.key) for p in path if hasattr(p, "key")][-1]


def init_model(model_cfg, seed=0, std=0.02, execution=None):
    """A random model built with numpy (eager jax init costs ~13 s on this CPU): normal(0, std)
    weights (default train.init_std's default), RMSNorm weights one, router biases zero;
    computed as `execution` (default ExecutionConfig())."""
    return random_model_numpy(model_cfg, seed, std, execution)


def make_copy_head(model_cfg, seed=0):
    """A model whose MTP modules copy the main head: eh_proj keeps only the hidden half and the MTP
    blocks' attention/FFN outputs are zero, so the draft distribution at position i is the main
    model's distribution at i. Drafts then hit whenever the text repeats a token (greedy loops)
    and miss otherwise, exercising both acceptance and rejection."""
    m = init_model(model_cfg, seed)
    d, depth = model_cfg.hidden_size, model_cfg.mtp_depth
    eye = jnp.concatenate([jnp.zeros((d, d)), jnp.eye(d)], axis=0)
    m.mtp.eh_proj.value = jnp.broadcast_to(eye, (depth, 2 * d, d)).astype(m.mtp.eh_proj.value.dtype)
    m.mtp.block.attn.wo.value = jnp.zeros_like(m.mtp.block.attn.wo.value)
    m.mtp.block.ffn.w_down.value = jnp.zeros_like(m.mtp.block.ffn.w_down.value)
    m.mtp.block.ffn.shared.down.value = jnp.zeros_like(m.mtp.block.ffn.shared.down.value)
    return m


def log_softmax(x):
    return np.asarray(jax.nn.log_softmax(jnp.asarray(x), axis=-1))
