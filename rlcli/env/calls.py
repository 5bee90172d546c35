"""How a tool call is written in the model's text, reading it back, and its `ToolResult`.

A call is `<tool>NAME</tool><args>ARGUMENT</args>` at the end of a model turn: generation stops
at `CALL_END`, the environment runs the tool and appends its output as a tool turn. One
format for every model (a small instruct model follows tags it is shown more readily than a
JSON schema), documented in the README.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The model's turn stops here: this string ends a call.
CALL_END = "</args>"

# The last call of a turn: the tool's name, then its argument text (which may span lines).
_CALL = re.compile(r"<tool>\s*(.*?)\s*</tool>\s*<args>(.*?)</args>\s*$", re.DOTALL)


@dataclass(frozen=True)
class ToolResult:
    """What a call gives back."""

    text: str  # what the model reads
    error: bool = False  # the call failed: unknown tool, bad input, the code raised or crashed
    timeout: bool = False  # stopped at env.tool_timeout_s


def parse_call(turn: str) -> tuple[str, str] | str:
    """(tool name, argument) of the call that ends `turn`, or why there is none (a message
    the model reads as the tool's output)."""
    match = _CALL.search(turn)
    if match is None:
        return (
            "Error: a call is <tool>NAME</tool><args>INPUT</args>; no <tool>NAME</tool> came "
            "right before <args>."
        )
    return match.group(1), match.group(2).strip()
