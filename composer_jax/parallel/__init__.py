"""Parallelism: the named mesh, the logical-axis rules table, one sharding helper, the batch-field
schema, expert- and context-parallel code, jit under a parallel context, and multi-host
initialisation. Imports nothing above it (train, model, inference). Sharding is opt-in: nothing
here is active without `activate(...)`."""
from composer_jax.parallel.mesh import make_mesh, mesh_shape
from composer_jax.parallel.rules import PRESETS, Rules, get_rules, logical_to_spec
from composer_jax.parallel.sharding import (CPAttention, ParallelContext, activate,
                                            context_from_config, current, gather_for_compute,
                                            shard, sharding_plan, state_shardings)

__all__ = ["make_mesh", "mesh_shape", "PRESETS", "Rules", "get_rules", "logical_to_spec",
           "CPAttention", "ParallelContext", "activate", "context_from_config", "current",
           "gather_for_compute", "shard", "sharding_plan", "state_shardings"]
