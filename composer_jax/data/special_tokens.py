"""The reserved special tokens of the chat / tool-call protocol: the ONE place their strings live.

The environment (env/), inference and SFT code render conversations with these strings; every
tokenizer composer_jax builds or loads encodes each of them as a single, atomic id. A trained
tokenizer gives them ids 0..len(ALL_SPECIAL_TOKENS)-1 in the order below (so PAD is id 0); a loaded
tokenizer that lacks them gets them appended after its own vocabulary.

Conversation layout (see `composer_jax/data/chat.py`):

    BOS SYSTEM ...text... END_OF_TURN
        TOOLS_BEGIN ...tool declarations (JSON)... TOOLS_END        (optional, inside the system turn)
    USER ...text... END_OF_TURN
    ASSISTANT ...text...
        TOOL_CALL_BEGIN name TOOL_CALL_ARGUMENT_BEGIN {json args} TOOL_CALL_END   (zero or more)
        END_OF_TURN
    TOOL TOOL_RESULT_BEGIN ...output... TOOL_RESULT_END END_OF_TURN
    ASSISTANT SUMMARY_BEGIN ...self-summary... SUMMARY_END END_OF_TURN        (self-summarization)
    EOS
"""

PAD = "<|pad|>"
BOS = "<|bos|>"
EOS = "<|eos|>"
SYSTEM = "<|system|>"
USER = "<|user|>"
ASSISTANT = "<|assistant|>"
TOOL = "<|tool|>"
END_OF_TURN = "<|end_of_turn|>"
TOOLS_BEGIN = "<|tool_declarations_begin|>"
TOOLS_END = "<|tool_declarations_end|>"
TOOL_CALL_BEGIN = "<|tool_call_begin|>"
TOOL_CALL_ARGUMENT_BEGIN = "<|tool_call_argument_begin|>"
TOOL_CALL_END = "<|tool_call_end|>"
TOOL_RESULT_BEGIN = "<|tool_result_begin|>"
TOOL_RESULT_END = "<|tool_result_end|>"
SUMMARY_BEGIN = "<|summary_begin|>"
SUMMARY_END = "<|summary_end|>"

# Order defines the ids of a trained tokenizer (PAD = 0). Append new tokens at the end only.
ALL_SPECIAL_TOKENS: tuple[str, ...] = (
    PAD, BOS, EOS, SYSTEM, USER, ASSISTANT, TOOL, END_OF_TURN,
    TOOLS_BEGIN, TOOLS_END, TOOL_CALL_BEGIN, TOOL_CALL_ARGUMENT_BEGIN, TOOL_CALL_END,
    TOOL_RESULT_BEGIN, TOOL_RESULT_END, SUMMARY_BEGIN, SUMMARY_END,
)

ROLE_TOKENS: dict[str, str] = {"system": SYSTEM, "user": USER, "assistant": ASSISTANT, "tool": TOOL}


def reserved_token(index: int) -> str:
    """Filler token that pads a trained vocabulary up to exactly the configured size."""
    return f"<|reserved_{index}|>"
