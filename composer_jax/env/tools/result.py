"""The result of one tool call, as returned to the agent."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ToolResult:
    """`output` is the text the agent sees; `is_error` marks a failed or malformed call;
    `finished` is set by the `finish` tool (the episode ends with `output` as final message)."""
    output: str
    is_error: bool = False
    finished: bool = False


def error(message: str) -> ToolResult:
    """An error result whose text starts with 'Error: '."""
    return ToolResult(output=f"Error: {message}", is_error=True)
