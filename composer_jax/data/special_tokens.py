"""The reserved special tokens of the tokenizer, in id order.

Every tokenizer composer_jax builds or loads encodes each of `ALL_SPECIAL_TOKENS` as a single,
atomic id. A trained tokenizer gives them ids 0..len(ALL_SPECIAL_TOKENS)-1 in the order below (so
PAD is id 0); a loaded tokenizer that lacks them gets them appended after its own vocabulary.

The chat template and its markers belong to the environment's protocol
(`composer_jax.env.protocol`: Kimi-K2 style, `<|im_system|>`, `<|im_middle|>`, `<|im_end|>`, the
tool-call section tokens); they are imported from there, so the tokenizer reserves exactly the
strings the policy reads and writes (`tests/data/test_data_sft_env.py` checks every protocol marker
is here and encodes to one id). `composer_jax/data/chat.py` turns a conversation into ids with
them. PAD, BOS, EOS and the self-summary markers are defined here.

Ids 3..9 once held an older role-token template (`<|system|>`, `<|end_of_turn|>`, ...); the protocol
markers took their places one for one, so every other id of a trained tokenizer is unchanged.
TOOL_RESULT_BEGIN / TOOL_RESULT_END are not used by the current template (tool results are
`<|im_system|>tool<|im_middle|>...`); they stay reserved so that the ids after them do not move.
"""

from composer_jax.env import protocol

PAD = "<|pad|>"
BOS = "<|bos|>"
EOS = "<|eos|>"
IM_SYSTEM = protocol.IM_SYSTEM                      # system, tool declarations and tool results
IM_USER = protocol.IM_USER
IM_ASSISTANT = protocol.IM_ASSISTANT
IM_MIDDLE = protocol.IM_MIDDLE                      # between a turn's role name and its content
IM_END = protocol.IM_END                            # end of every turn
TOOL_CALLS_BEGIN = protocol.TOOL_CALLS_BEGIN        # the tool-call section of an assistant turn
TOOL_CALLS_END = protocol.TOOL_CALLS_END
TOOL_CALL_BEGIN = protocol.TOOL_CALL_BEGIN          # functions.NAME:INDEX
TOOL_CALL_ARGUMENT_BEGIN = protocol.TOOL_CALL_ARG_BEGIN  # {json arguments}
TOOL_CALL_END = protocol.TOOL_CALL_END
TOOL_RESULT_BEGIN = "<|tool_result_begin|>"         # reserved, unused by the current template
TOOL_RESULT_END = "<|tool_result_end|>"             # reserved, unused by the current template
SUMMARY_BEGIN = "<|summary_begin|>"
SUMMARY_END = "<|summary_end|>"

# Order defines the ids of a trained tokenizer (PAD = 0). Append new tokens at the end only.
ALL_SPECIAL_TOKENS: tuple[str, ...] = (
    PAD, BOS, EOS, IM_SYSTEM, IM_USER, IM_ASSISTANT, IM_MIDDLE, IM_END,
    TOOL_CALLS_BEGIN, TOOL_CALLS_END, TOOL_CALL_BEGIN, TOOL_CALL_ARGUMENT_BEGIN, TOOL_CALL_END,
    TOOL_RESULT_BEGIN, TOOL_RESULT_END, SUMMARY_BEGIN, SUMMARY_END,
)

_missing = sorted(set(protocol.SPECIAL_TOKENS) - set(ALL_SPECIAL_TOKENS))
if _missing:  # the protocol grew a marker: append it to ALL_SPECIAL_TOKENS
    raise ImportError(f"chat-protocol markers {_missing} are not reserved tokenizer special tokens; "
                      "append them to composer_jax.data.special_tokens.ALL_SPECIAL_TOKENS")


def reserved_token(index: int) -> str:
    """Filler token that pads a trained vocabulary up to exactly the configured size."""
    return f"<|reserved_{index}|>"
