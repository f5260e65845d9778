"""Glue between the weight store and the trainer / inference engine.

Trainer:  store.publish(version, publishable(train_state.params, train_state.buffers))
Engine:   swap_from_store(engine, reader)      # newest version, applied between decode steps

The engine's state is the whole `nnx.split(model)` State (parameters and router biases); the
trainer keeps parameters and buffers as two pure dicts with disjoint leaves, so `publishable`
merges them into the engine's layout and the names match.
"""
from __future__ import annotations

from composer_jax.rl.weights.codec import WeightStoreError
from composer_jax.rl.weights.store import WeightReader, flatten


def publishable(params: dict, buffers: dict | None = None) -> dict:
    """One nested dict with the leaves of both (the layout of nnx.to_pure_dict(engine.state))."""
    def merge(a, b, path):
        out = dict(a)
        for k, v in b.items():
            if k in out:
                if not (isinstance(out[k], dict) and isinstance(v, dict)):
                    raise WeightStoreError(f"params and buffers both hold {'/'.join(path + [str(k)])}")
                out[k] = merge(out[k], v, path + [str(k)])
            else:
                out[k] = v
        return out
    return merge(params, buffers or {}, [])


def fetch_state(reader: WeightReader, version: int | None, template):
    """Version `version` (None = latest) as a new nnx.State shaped like `template` (the engine's
    current state, left untouched): each leaf is cast to the template leaf's dtype (bf16 -> f32 is
    exact) and placed with the template leaf's sharding (the engine's layout: one device today).
    Returns (state, version)."""
    import jax
    import numpy as np
    from flax import nnx

    version = reader.latest() if version is None else version
    if version is None:
        raise WeightStoreError("nothing has been published yet")
    flat = reader.fetch(version)
    pure = nnx.to_pure_dict(template)
    names = flatten(pure)
    missing = sorted(set(names) - set(flat))
    if missing:
        raise WeightStoreError(f"version {version} lacks {len(missing)} of the engine's tensors, "
                               f"e.g. {missing[:3]}; publish publishable(params, buffers)")
    leaves = []
    for name, t in names.items():
        a = flat[name]
        if tuple(a.shape) != tuple(t.shape):
            raise WeightStoreError(f"{name}: published shape {a.shape} != engine shape {t.shape}")
        a = np.asarray(a).astype(t.dtype, copy=False)
        sharding = getattr(t, "sharding", None)
        leaves.append(jax.device_put(a, sharding) if sharding is not None else jax.numpy.asarray(a))
    new_pure = jax.tree.unflatten(jax.tree.structure(pure), leaves)
    state = jax.tree.map(lambda x: x, template)
    nnx.replace_by_pure_dict(state, new_pure)
    return state, version


def swap_from_store(engine, reader: WeightReader, version: int | None = None) -> int | None:
    """Fetches `version` (None = latest) and hands it to `engine.swap_weights(state, version)`;
    returns the version, or None when the engine already has it."""
    target = reader.latest() if version is None else version
    if target is None or target == getattr(engine, "version", None):
        return None
    state, target = fetch_state(reader, target, engine.state)
    engine.swap_weights(state, target)
    return target
