"""The single-device (no mesh) train-gradient program of the CPU side-by-side model, as jaxpr text.

    python benchmarks/single_device_jaxpr.py > OUT.txt

The model of benchmarks/maxtext_side_by_side.py (emb 256, 4 layers, 8 experts top-2, fp32 weights,
bf16 compute, batch 4 x 256, vocab 32,768), `jax.grad` of the mean logit, at remat none and full.
Two trees whose outputs are equal (memory addresses stripped) trace the same CPU program.
"""
import re

import jax
import jax.numpy as jnp
from flax import nnx

from composer_jax.config import ExecutionConfig, ModelConfig
from composer_jax.model import init_model

cfg = ModelConfig(name="sbs", vocab_size=32768, hidden_size=256, num_layers=4, first_k_dense=1,
                  dense_intermediate_size=64, moe_intermediate_size=64, num_routed_experts=8,
                  num_shared_experts=1, num_experts_per_tok=2, num_heads=4, q_lora_rank=32,
                  kv_lora_rank=16, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                  mtp_depth=0)
for remat in ("none", "full"):
    model = init_model(cfg, 0, ExecutionConfig(param_dtype="float32", compute_dtype="bfloat16",
                                               remat=remat))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tokens = jnp.zeros((4, 256), jnp.int32)

    def loss(p):
        return jnp.mean(nnx.merge(graphdef, p, rest)(tokens).logits)
    print(f"== remat {remat}")
    print(re.sub(r"0x[0-9a-f]+", "", str(jax.make_jaxpr(jax.grad(loss))(params))))
