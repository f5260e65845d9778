"""The DeepSeek-V3 / Kimi-K2 MoE transformer with MTP, and Hugging Face checkpoint I/O.

Public names: `Transformer`, `ModelOutput`, `init_model`, `abstract_model`, `count_params`;
`composer_jax.model.hf.load_hf` / `save_hf`.
"""
from composer_jax.model.params import abstract_model, count_params, init_model
from composer_jax.model.transformer import ModelOutput, Transformer

__all__ = ["Transformer", "ModelOutput", "init_model", "abstract_model", "count_params"]
