"""Mesh, rules, context-parallel order and the sharding-plan golden (no fake devices needed)."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from composer_jax.config import MESH_AXES, MeshConfig, tiny
from composer_jax.errors import ConfigError
from composer_jax.model import abstract_model
from composer_jax.parallel import ParallelContext, get_rules, logical_to_spec, make_mesh, shard
from composer_jax.parallel import context_parallel as cp
from composer_jax.parallel.sharding import sharding_plan

GOLDEN = os.path.join(os.path.dirname(__file__), "golden_plan_tiny.json")


def abstract_ctx(rules, **sizes):
    shape = tuple(sizes.get(a, 1) for a in MESH_AXES)
    return ParallelContext(AbstractMesh(shape, MESH_AXES), get_rules(rules))


def test_mesh_errors_name_axes_and_sizes():
    with pytest.raises(ConfigError, match=r"multiply to 12.*8 devices"):
        make_mesh(MeshConfig(data=2, fsdp=3, expert=2), devices=list(range(8)))
    with pytest.raises(ConfigError, match="not divisible by the fixed axes"):
        MeshConfig(data=3, fsdp=-1).resolved(8)
    with pytest.raises(ConfigError, match="unknown preset 'bogus'"):
        MeshConfig(rules="bogus")
    with pytest.raises(ConfigError, match="unknown preset 'bogus'"):
        get_rules("bogus")


def test_spec_divisibility_error_and_dedup():
    rules = get_rules("ep_fsdp")
    sizes = {"data": 1, "fsdp": 2, "expert": 4, "context": 1, "tensor": 2}
    # expert weights: `expert` takes the expert axis, embed keeps only fsdp
    spec = logical_to_spec(("expert", "embed", "expert_mlp"), rules, (8, 64, 32), sizes)
    assert spec == P("expert", "fsdp", "tensor")
    with pytest.raises(ConfigError, match=r"dim 1 \(logical axis 'embed'\) has size 12.*'fsdp': 2"):
        logical_to_spec(("vocab", "embed"), rules, (16, 12), sizes, what="w")


def test_shard_is_identity_without_context():
    x = jnp.arange(8.0)
    assert shard(x, ("batch",)) is x


def test_load_balanced_order():
    perm = cp.load_balance_permutation(16, 4)        # 8 chunks of 2
    shards = perm.reshape(4, 4)
    assert shards[0].tolist() == [0, 1, 14, 15] and shards[3].tolist() == [6, 7, 8, 9]
    # causal work per shard (sum of key counts) is equal
    assert len({int((s + 1).sum()) for s in shards}) == 1
    x = jnp.arange(32).reshape(2, 16)
    np.testing.assert_array_equal(cp.restore(cp.reorder(x, 4), 4), x)
    with pytest.raises(ConfigError, match="divisible by 2 \\* context=8"):
        cp.load_balance_permutation(12, 4)


def test_reorder_batch_keeps_fields_aligned():
    tokens = jnp.arange(16).reshape(1, 16)
    batch = {"tokens": tokens, "targets": tokens + 1, "loss_mask": jnp.ones((1, 16))}
    out = cp.reorder_batch(batch, cp=2, mtp_depth=1)
    np.testing.assert_array_equal(out["targets"], out["tokens"] + 1)
    np.testing.assert_array_equal(out["token_index"], out["tokens"])
    # MTP future tokens were computed before the reorder: t_{i+1} of each token
    np.testing.assert_array_equal(out["mtp_tokens"][0], jnp.where(out["tokens"] < 15,
                                                                  out["tokens"] + 1, 0))


def current_plan():
    _, state = nnx.split(abstract_model(tiny()))
    plans = {}
    for rules, sizes in [("fsdp", dict(data=2, fsdp=2, tensor=2)),
                         ("ep_fsdp", dict(fsdp=2, expert=2, tensor=2)),
                         ("cp_ep", dict(fsdp=2, expert=2, context=2))]:
        plans[rules] = sharding_plan(state, abstract_ctx(rules, **sizes))
    return plans


def test_sharding_plan_golden():
    """Regenerate after an intended change: python -c 'from tests.parallel.test_rules import
    write_golden; write_golden()'. The diff of golden_plan_tiny.json shows the sharding change."""
    with open(GOLDEN) as f:
        assert current_plan() == json.load(f)


def write_golden():
    with open(GOLDEN, "w") as f:
        json.dump(current_plan(), f, indent=1, sort_keys=True)
