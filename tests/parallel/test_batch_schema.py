"""The one batch schema: field validation, placement specs for ranks 1-4 and the context-parallel
reorder along each field's own token axis."""
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from composer_jax.errors import ConfigError
from composer_jax.parallel import context_parallel as cp
from composer_jax.parallel import get_rules, logical_to_spec
from composer_jax.parallel.batch_schema import LM_FIELDS, ROUTER_REPLAY_FIELDS, Field

SCHEMA = LM_FIELDS.extend(ROUTER_REPLAY_FIELDS).extend({
    "advantages": Field("float32", ("batch",))})


def test_fields_validate_and_report_their_axes():
    f = SCHEMA["router_replay"]
    assert (f.rank, f.batch_axis, f.token_axis, f.per_token) == (4, 1, 2, True)
    assert SCHEMA["advantages"].per_token is False and SCHEMA["advantages"].token_axis is None
    assert set(SCHEMA.names(derived=True)) == {"token_index", "mtp_tokens"}
    with pytest.raises(ConfigError, match="rank 1 to 4"):
        Field("int32", ("batch", "seq", None, None, None))
    with pytest.raises(ConfigError, match="exactly one 'batch'"):
        Field("int32", ("seq",))
    with pytest.raises(ConfigError, match="already declared"):
        SCHEMA.extend({"advantages": Field("float32", ("batch", "seq"))})
    with pytest.raises(ConfigError, match="'nope' is not declared"):
        SCHEMA["nope"]


def test_placement_specs_for_ranks_1_to_4():
    rules, sizes = get_rules("cp_ep"), {"data": 1, "fsdp": 2, "expert": 2, "context": 2,
                                         "tensor": 1}
    shapes = {"advantages": (8,), "tokens": (8, 16), "mtp_mask": (8, 1, 16),
              "router_replay": (3, 8, 16, 2)}
    specs = {k: logical_to_spec(SCHEMA[k].axes, rules, s, sizes) for k, s in shapes.items()}
    assert specs == {"advantages": P(("fsdp", "expert")),
                     "tokens": P(("fsdp", "expert"), "context"),
                     "mtp_mask": P(("fsdp", "expert"), None, "context"),
                     "router_replay": P(None, ("fsdp", "expert"), "context", None)}


def test_reorder_moves_every_per_token_field_along_its_token_axis():
    b, t, lm, k = 2, 8, 3, 2
    tokens = jnp.arange(b * t, dtype=jnp.int32).reshape(b, t)
    replay = jnp.broadcast_to(tokens[None, :, :, None], (lm, b, t, k))
    adv = jnp.array([1.0, -1.0])
    out = cp.reorder_batch({"tokens": tokens, "router_replay": replay, "advantages": adv}, cp=2,
                           schema=SCHEMA)
    perm = cp.load_balance_permutation(t, 2)
    np.testing.assert_array_equal(out["tokens"], np.asarray(tokens)[:, perm])
    np.testing.assert_array_equal(out["router_replay"][..., 0],
                                  np.broadcast_to(np.asarray(tokens)[:, perm], (lm, b, t)))
    np.testing.assert_array_equal(out["advantages"], adv)
    np.testing.assert_array_equal(out["token_index"][0], perm)
