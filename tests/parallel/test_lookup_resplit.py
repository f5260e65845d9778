"""When the embedding reads its rows from the table's storage shards (issue 44)."""
from jax.sharding import PartitionSpec as P

from composer_jax.parallel.sharding import resplit_is_one_all_to_all as one


def test_embedding_lookup_on_shards_only_where_the_resplit_is_one_all_to_all():
    """`sharding.lookup_on_shards` reads rows from the table's shards only where moving the
    table's model-dim axes onto the token dims is one all-to-all."""
    assert one(("fsdp",), P("fsdp", None))                      # the side-by-side meshes
    assert one(("fsdp", "expert"), P(("data", "fsdp", "expert"), None))
    assert one(("context",), P(None, "context"))
    assert one(("tensor",), P("fsdp", None))                     # not a token axis: no move
    # kimi's cp_ep mesh: (context, expert) split the model dim, expert the batch, context seq
    assert not one(("context", "expert"), P("expert", "context"))
    assert not one(("fsdp", "context", "expert"), P(("fsdp", "expert"), "context"))
    assert not one(("expert", "fsdp"), P(("fsdp", "expert"), None))   # another order
