"""Rendering a conversation into token ids plus a per-token trainable mask (SFT).

Layout: `BOS (ROLE content END_OF_TURN)* EOS` with the role tokens of `special_tokens`. Trainable
tokens are exactly the assistant turns' content and their closing END_OF_TURN (the model must learn
to end its turn); role tokens, system/user/tool turns, BOS and EOS are not. Each piece is encoded on
its own, so BPE merges never cross a role boundary and the mask aligns with the ids exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

from composer_jax.data import special_tokens as st


def render_messages(messages: Sequence[dict[str, str]]) -> list[tuple[str, bool]]:
    """`[(text, trainable)]` pieces of a conversation; messages are `{"role": ..., "content": ...}`."""
    pieces: list[tuple[str, bool]] = [(st.BOS, False)]
    for message in messages:
        role = message["role"]
        if role not in st.ROLE_TOKENS:
            raise ValueError(f"unknown chat role {role!r}; valid roles: {sorted(st.ROLE_TOKENS)}")
        is_assistant = role == "assistant"
        pieces += [(st.ROLE_TOKENS[role], False), (message["content"], is_assistant), (st.END_OF_TURN, is_assistant)]
    pieces.append((st.EOS, False))
    return pieces


def encode_messages(tokenizer, messages: Sequence[dict[str, str]]) -> tuple[list[int], list[int]]:
    """`(ids, trainable)`, equal lengths; trainable[i] = 1 on assistant tokens (see module doc)."""
    ids: list[int] = []
    trainable: list[int] = []
    for text, is_trainable in render_messages(messages):
        piece = tokenizer.encode(text)
        ids += piece
        trainable += [int(is_trainable)] * len(piece)
    return ids, trainable
