"""Model FLOPs per token, from the config alone (the MFU numerator).

Convention (PaLM appendix B / Chinchilla, as used by MaxText): a matmul with a [m, n] weight costs
2*m*n FLOPs per token forward and twice that backward, so training costs 6 * (active matmul
parameters) per token; attention adds, per layer and token, 2 * H * (d_qk + d_v) FLOPs per attended
key forward (QK^T and PV), x3 for training, with (T + 1) / 2 keys on average under a causal mask.
The embedding lookup is not a matmul and is excluded; the LM head is included (once for the main
head and once per MTP depth, which reuses it). Routed experts count num_experts_per_tok of
num_routed_experts.
"""
from __future__ import annotations

from composer_jax.config import ModelConfig


def _attention_matmul_params(cfg: ModelConfig) -> int:
    d, h = cfg.hidden_size, cfg.num_heads
    if cfg.q_lora_rank > 0:
        q = d * cfg.q_lora_rank + cfg.q_lora_rank * h * cfg.qk_head_dim
    else:
        q = d * h * cfg.qk_head_dim
    kv = d * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) + cfg.kv_lora_rank * h * (
        cfg.qk_nope_head_dim + cfg.v_head_dim)
    return q + kv + h * cfg.v_head_dim * d


def _ffn_active_params(cfg: ModelConfig, moe: bool) -> int:
    d = cfg.hidden_size
    if not moe:
        return 3 * d * cfg.dense_intermediate_size
    experts = cfg.num_experts_per_tok + cfg.num_shared_experts
    return 3 * d * cfg.moe_intermediate_size * experts + d * cfg.num_routed_experts


def flops_per_token(cfg: ModelConfig, seq_len: int, training: bool = True,
                    with_mtp: bool = True) -> dict[str, float]:
    """{"total", "matmul", "attention", "active_matmul_params"} in FLOPs per token."""
    attn = _attention_matmul_params(cfg)
    layers = [(False, cfg.first_k_dense), (True, cfg.num_moe_layers)]
    matmul_params = sum(n * (attn + _ffn_active_params(cfg, moe)) for moe, n in layers)
    matmul_params += cfg.hidden_size * cfg.vocab_size                   # LM head
    n_attn_layers = cfg.num_layers
    if with_mtp and cfg.mtp_depth > 0:
        per_depth = (2 * cfg.hidden_size * cfg.hidden_size + attn
                     + _ffn_active_params(cfg, cfg.num_moe_layers > 0)
                     + cfg.hidden_size * cfg.vocab_size)
        matmul_params += cfg.mtp_depth * per_depth
        n_attn_layers += cfg.mtp_depth
    mult = 3 if training else 1
    matmul = 2 * mult * matmul_params
    keys = (seq_len + 1) / 2
    attention = (2 * mult * n_attn_layers * cfg.num_heads
                 * (cfg.qk_head_dim + cfg.v_head_dim) * keys)
    return {"total": float(matmul + attention), "matmul": float(matmul),
            "attention": float(attention), "active_matmul_params": float(matmul_params)}
