"""Tokenizer: training, special tokens, round trips, save/load, caching, vocab checks, tiktoken files."""

from __future__ import annotations

import re

import pytest
import tokenizers
from tokenizers import models

from composer_jax.data import special_tokens as st
from composer_jax.data import tiktoken_file
from composer_jax.data.config import SplitPattern
from composer_jax.data.errors import DataError
from composer_jax.data.tokenizer import build_or_load_tokenizer, check_vocab, load_tokenizer, train_tokenizer
from composer_jax.errors import ConfigError

SAMPLES = [
    "def f(x):\n    return x + 1\n",
    "class Ünïcode:\n    '''中文 docstring — emoji 🚀'''\n    pass\n",
    "\t\tmixed   whitespace\r\n\n\n  trailing  ",
    "",
]


def test_trained_vocab_and_special_tokens(small_data):
    cfg, corpus, tok = small_data
    assert tok.vocab_size == cfg.vocab_size
    for i, token in enumerate(st.ALL_SPECIAL_TOKENS):
        assert tok.special.by_token[token] == i
        assert tok.encode(token) == [i]
    assert tok.special.pad == 0
    text = f"x = 1{st.TOOL_CALL_BEGIN}read_file{st.TOOL_CALL_ARGUMENT_BEGIN}{{}}{st.TOOL_CALL_END}"
    ids = tok.encode(text)
    for token in (st.TOOL_CALL_BEGIN, st.TOOL_CALL_ARGUMENT_BEGIN, st.TOOL_CALL_END):
        assert ids.count(tok.special.by_token[token]) == 1
    assert tok.decode(ids) == text


def test_round_trip(small_data):
    _, corpus, tok = small_data
    texts = SAMPLES + [corpus.text("train", i) for i in range(min(20, corpus.num_docs("train")))]
    for text in texts:
        assert tok.decode(tok.encode(text)) == text
    assert [tok.decode(ids) for ids in tok.encode_batch(texts)] == texts


def test_save_load_and_cache(small_data, tmp_path):
    cfg, corpus, tok = small_data
    path = tok.save(tmp_path)
    loaded = load_tokenizer(path)
    text = corpus.text("train", 0)
    assert loaded.encode(text) == tok.encode(text) and loaded.vocab_size == tok.vocab_size
    again = build_or_load_tokenizer(cfg, corpus)
    assert again.fingerprint == tok.fingerprint


def test_vocab_mismatch_errors(small_data):
    cfg, corpus, tok = small_data
    check_vocab(tok, tok.vocab_size)
    check_vocab(tok, tok.vocab_size + 100)  # padded embedding rows are fine
    with pytest.raises(ConfigError, match="600 tokens but the model's vocab_size is 500"):
        check_vocab(tok, 500)
    with pytest.raises(ConfigError, match="vocab_size"):
        check_vocab(tok, tok.vocab_size + 5000)
    with pytest.raises(ConfigError, match="vocab_size is 512"):
        build_or_load_tokenizer(cfg, corpus, model_vocab_size=512)


def test_tokenizer_json_without_specials_gets_them_appended(tmp_path):
    plain = tokenizers.Tokenizer(models.BPE(vocab={"a": 0, "b": 1, "ab": 2}, merges=[("a", "b")]))
    plain.save(str(tmp_path / "plain.json"))
    loaded = load_tokenizer(tmp_path / "plain.json")
    assert loaded.vocab_size == 3 + len(st.ALL_SPECIAL_TOKENS)
    assert loaded.special.pad == 3 and loaded.encode(st.EOS) == [loaded.special.eos]


def test_train_tokenizer_pads_to_exact_vocab():
    tok = train_tokenizer(["def f(x): return x\n"] * 50, 400, SplitPattern.CL100K)
    assert tok.vocab_size == 400 and tok.encode(st.reserved_token(0)) == [tok.token_to_id(st.reserved_token(0))]
    with pytest.raises(ConfigError, match="vocab_size=100"):
        train_tokenizer(["x"], 100, SplitPattern.CL100K)


def test_bad_tokenizer_files(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(DataError, match="not a valid tokenizer.json"):
        load_tokenizer(tmp_path / "bad.json")
    (tmp_path / "bad.model").write_text("QUJD 0\nnot-base64!! x\n")
    with pytest.raises(DataError, match="bad.model:2"):
        load_tokenizer(tmp_path / "bad.model")
    (tmp_path / "gaps.model").write_text("QQ== 0\nQg== 5\n")
    with pytest.raises(DataError, match="ranks must be exactly"):
        load_tokenizer(tmp_path / "gaps.model")
    with pytest.raises(DataError, match="cannot read"):
        load_tokenizer(tmp_path / "missing.model")


# --- tiktoken-format files -------------------------------------------------------------------------

SIMPLE_PATTERN = r" ?[A-Za-z_]+| ?[0-9]{1,3}| ?[^\sA-Za-z_0-9]+|\s+(?!\S)|\s+"


def _ranks_from_trained(tok) -> dict[bytes, int]:
    """tiktoken ranks from a trained byte-level BPE: vocab order without the added tokens."""
    decode = {ch: b for b, ch in tiktoken_file.bytes_to_unicode().items()}
    vocab = tok.hf.get_vocab(with_added_tokens=False)
    entries = sorted((i, s) for s, i in vocab.items() if s not in st.ALL_SPECIAL_TOKENS)
    return {bytes(decode[c] for c in s): rank for rank, (_, s) in enumerate(entries)}


def _reference_encode(text: str, ranks: dict[bytes, int]) -> list[int]:
    """tiktoken's algorithm in plain Python: split, whole-piece lookup, else lowest-rank merges."""
    out = []
    for piece in re.findall(SIMPLE_PATTERN, text):
        data = piece.encode("utf-8")
        if data in ranks:
            out.append(ranks[data])
            continue
        parts = [bytes([b]) for b in data]
        while len(parts) > 1:
            pairs = [(ranks.get(parts[i] + parts[i + 1]), i) for i in range(len(parts) - 1)]
            pairs = [p for p in pairs if p[0] is not None]
            if not pairs:
                break
            _, i = min(pairs)
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        out += [ranks[p] for p in parts]
    return out


def test_tiktoken_file_matches_reference_bpe(small_data, tmp_path):
    _, corpus, tok = small_data
    ranks = _ranks_from_trained(tok)
    path = tmp_path / "tiktoken.model"
    tiktoken_file.write_ranks(ranks, path)
    assert tiktoken_file.read_ranks(path) == ranks
    hf = tiktoken_file.tokenizer_from_ranks(ranks, SIMPLE_PATTERN)
    texts = SAMPLES + [corpus.text("validation", i) for i in range(corpus.num_docs("validation"))][:10]
    for text in texts:
        assert hf.encode(text, add_special_tokens=False).ids == _reference_encode(text, ranks)


def test_load_tiktoken_file_appends_special_tokens(small_data, tmp_path):
    _, corpus, tok = small_data
    ranks = _ranks_from_trained(tok)
    tiktoken_file.write_ranks(ranks, tmp_path / "tiktoken.model")
    loaded = load_tokenizer(tmp_path / "tiktoken.model", SplitPattern.KIMI)
    assert loaded.vocab_size == len(ranks) + len(st.ALL_SPECIAL_TOKENS)
    assert loaded.special.pad == len(ranks)
    text = corpus.text("train", 1) + st.IM_END
    ids = loaded.encode(text)
    assert loaded.decode(ids) == text and ids[-1] == loaded.special.by_token[st.IM_END]
    assert max(ids[:-1]) < len(ranks)
