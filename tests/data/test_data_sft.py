"""SFT sample extraction and chat encoding (the pipeline-level mask test is in test_data_pipeline)."""

from __future__ import annotations

import textwrap

import pytest

from composer_jax.data import special_tokens as st
from composer_jax.data.chat import encode_messages, render_messages
from composer_jax.data.sft import function_samples, sample_messages
from composer_jax.env import protocol

SOURCE = textwrap.dedent('''\
    import functools


    class Box:
        @functools.cache
        def area(self, scale: int = 2) -> int:
            """Return the area of the box multiplied by the scale."""
            return self.w * self.h * scale

        def undocumented(self):
            return 1


    def short_doc(x):
        """Tiny."""
        return x


    def only_docstring():
        """A function whose body is nothing but this docstring."""


    async def fetch(url, *, retries=3):
        """Fetch the url, retrying a few times on failure before giving up."""
        for _ in range(retries):
            return await get(url)
    ''')


def test_function_samples_select_documented_functions():
    samples = {s["name"]: s for s in function_samples(SOURCE, min_doc_chars=20, max_lines=30)}
    assert sorted(samples) == ["area", "fetch"]
    area = samples["area"]
    assert area["code"].startswith("@functools.cache\ndef area(self, scale: int = 2) -> int:")
    assert area["signature"] == "def area(self, scale: int=2)"
    assert samples["fetch"]["signature"].startswith("async def fetch(url, *, retries=3)")
    assert list(function_samples(SOURCE, 20, max_lines=3)) == []
    assert list(function_samples("def broken(:\n", 0, 10)) == []


def test_chat_encoding_marks_only_assistant_tokens(small_data):
    _, _, tok = small_data
    sample = next(function_samples(SOURCE, 20, 30))
    messages = sample_messages(sample)
    ids, trainable = encode_messages(tok, messages)
    assert len(ids) == len(trainable)
    trained = tok.decode([i for i, t in zip(ids, trainable) if t])
    assert trained == sample["code"] + st.IM_END
    untrained = tok.decode([i for i, t in zip(ids, trainable) if not t])
    assert untrained.startswith(st.BOS + st.IM_SYSTEM + "system" + st.IM_MIDDLE)
    assert untrained.endswith(st.IM_ASSISTANT + "assistant" + st.IM_MIDDLE)
    assert tok.decode(ids) == "".join(text for text, _ in render_messages(messages))
    assert tok.decode(ids) == st.BOS + protocol.render_prompt(messages, add_generation_prompt=False)
    with pytest.raises(ValueError, match="unknown role"):
        render_messages([{"role": "robot", "content": "x"}])
