"""How a tool call is written in the model's text and read back (`CallFormat`), what a call
gives back (`ToolResult`) and what the episode keeps of it (`ToolCall`).

rlcli's own format (`env.tool_format=rlcli`, `RLCLI_CALLS`) is
`<tool>NAME</tool><args>ARGUMENT</args>` at the end of a model turn: generation stops at
`CALL_END`, the environment runs the tool and appends its output as a tool turn. A small
instruct model follows tags it is shown more readily than a JSON schema. The model's own chat
template format (`env.tool_format=chat_template`) is `env.chat_template.TemplateCalls`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

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


@dataclass(frozen=True)
class ToolCall:
    """One call as an episode keeps it: which tool, on what, and what came back."""

    tool: str | None  # None when the turn held no readable call
    input: str | None  # the argument text the tool was given
    result: ToolResult


class CallFormat(Protocol):
    """How the model writes a call: generation stops at `stop`; `parse` reads the call that
    ends a turn as (tool name, arguments: a text or a JSON object), or says why there is none
    (a message the model reads as the tool's output)."""

    stop: str

    def parse(self, turn: str) -> tuple[str, str | dict] | str: ...


def parse_call(turn: str) -> tuple[str, str] | str:
    """(tool name, argument) of the `<tool>` call that ends `turn`, or why there is none."""
    match = _CALL.search(turn)
    if match is None:
        return (
            "Error: a call is <tool>NAME</tool><args>INPUT</args>; no <tool>NAME</tool> came "
            "right before <args>."
        )
    return match.group(1), match.group(2).strip()


@dataclass(frozen=True)
class RlcliCalls:
    """rlcli's `<tool>NAME</tool><args>ARGUMENT</args>`."""

    stop: str = CALL_END

    def parse(self, turn: str) -> tuple[str, str] | str:
        return parse_call(turn)


RLCLI_CALLS = RlcliCalls()
