"""`env.tool_format=chat_template`: the tools declared through the model's own chat template
(`tokenizer.apply_chat_template(messages, tools=[...])`, as TRL and verl users know it), and
the model's calls read in the format that template writes them (`TemplateCalls`), which is
read from the template itself (`template_calls`). Generation stops at the template's end tag;
the tool's output goes back as a `{"role": "tool"}` message through the same template
(`rollout.multiturn.tool_turn_text`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from rlcli.config import ConfigError
from rlcli.env.tools import TOOLS, tool_name, user_function_summary

# Probe names: plain identifiers, which every template writes as they are.
_TOOL, _ARGUMENT, _VALUE = "rlcli_probe_tool", "rlcli_probe_argument", "rlcli_probe_value"
_SAID, _OUTPUT = "rlcli_probe_said", "rlcli_probe_output"


def tool_schemas(entries: list[str]) -> list[dict]:
    """The tools of `env.tools` as the JSON schemas a chat template declares: each takes one
    string argument. A function of the user's is described by its docstring's first line and
    its first parameter, read from its file without running it."""
    schemas = []
    for entry in entries:
        if entry in TOOLS:
            spec = TOOLS[entry]
            what, argument, example = spec.what, spec.argument, f"e.g. {spec.example}"
        else:
            (what, argument), example = user_function_summary(entry), "text"
        schemas.append(function_schema(tool_name(entry), what, argument, example))
    return schemas


def function_schema(name: str, what: str, argument: str, help_: str) -> dict:
    """A function of one string argument, laid out as chat templates take tools."""
    parameters = {
        "type": "object",
        "properties": {argument: {"type": "string", "description": help_}},
        "required": [argument],
    }
    return {
        "type": "function",
        "function": {"name": name, "description": what, "parameters": parameters},
    }


@dataclass(frozen=True)
class TemplateCalls:
    """A call as a chat template writes it: `start`, a JSON object naming the tool (under
    `name_key`) and its arguments (under `arguments_key`), then `stop`."""

    start: str
    stop: str
    name_key: str = "name"
    arguments_key: str = "arguments"

    @property
    def example(self) -> str:
        call = f'{{"{self.name_key}": NAME, "{self.arguments_key}": {{...}}}}'
        return f"{self.start}{call}{self.stop}"

    def parse(self, turn: str) -> tuple[str, str | dict] | str:
        """(tool name, arguments) of the call that ends `turn`, or why there is none."""
        _, found, body = turn.rpartition(self.start)
        body = body.strip()
        if not found or not body.endswith(self.stop):
            return f"Error: a call is {self.example}; no {self.start} came before {self.stop}."
        text = body[: -len(self.stop)].strip()
        try:
            call = json.loads(text)
        except json.JSONDecodeError as err:
            why = f"{err.msg} at column {err.colno}"
            return f"Error: the call is not JSON ({why}); write {self.example}."
        except RecursionError:  # json.loads recurses once per bracket: 1,000 `[` pass the limit
            return f"Error: the call is not JSON (nested too deep); write {self.example}."
        name = call.get(self.name_key) if isinstance(call, dict) else None
        if not isinstance(name, str):
            return f'Error: the call names no tool under "{self.name_key}"; write {self.example}.'
        arguments = call.get(self.arguments_key, {})
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except (json.JSONDecodeError, RecursionError):
                return name, arguments
        if not isinstance(arguments, dict | str):
            return f'Error: "{self.arguments_key}" must be a JSON object; write {self.example}.'
        return name, arguments


def template_calls(tokenizer) -> TemplateCalls:
    """How the tokenizer's chat template writes a call, read from the template; a ConfigError
    when it has none, declares no tools, cannot write a call or a tool message, or writes a
    call with no end tag to stop generation at.

    It renders probe conversations: one with and one without tools (a template that renders
    both alike has no tool support, as SmolLM2-135M-Instruct's), and an assistant turn holding
    a call, whose JSON sits between the template's start and end tags (Qwen2.5's and Qwen3's
    `<tool_call>` and `</tool_call>`)."""
    who = tokenizer.name_or_path
    fix = (
        "set env.tool_format=rlcli (rlcli's own <tool>NAME</tool><args>INPUT</args> calls, "
        "taught in the system message; any model can learn them), or use a model whose chat "
        "template declares tools (Qwen2.5, Qwen3)"
    )
    if not tokenizer.chat_template:
        raise ConfigError(
            f"env.tool_format=chat_template renders the tools through the model's chat "
            f"template, but {who} has none; {fix}."
        )
    tools = [function_schema(_TOOL, "a probe", _ARGUMENT, "text")]
    user = [{"role": "user", "content": "?"}]
    said = {"role": "assistant", "content": _SAID}
    call = {"type": "function", "function": {"name": _TOOL, "arguments": {_ARGUMENT: _VALUE}}}

    def render(messages, with_tools=True, reply=False) -> str:
        return tokenizer.apply_chat_template(
            messages,
            tools=tools if with_tools else None,
            tokenize=False,
            add_generation_prompt=reply,
        )

    try:
        declared = render(user, reply=True)
        bare = render(user, with_tools=False, reply=True)
    except Exception as err:  # the template's own error, e.g. a `raise_exception`
        raise ConfigError(
            f"env.tool_format=chat_template: the chat template of {who} fails when given "
            f"tools ({type(err).__name__}: {err}); {fix}."
        ) from None
    if declared == bare or _TOOL not in declared:
        raise ConfigError(
            f"env.tool_format=chat_template: the chat template of {who} has no tool support "
            "(it renders a prompt alike with and without tools=[...], so the model would never "
            f"be shown them); {fix}."
        )
    try:
        plain_turn = render([*user, said])
        call_turn = render([*user, {**said, "tool_calls": [call]}])
        tool_turn = render([*user, said, {"role": "tool", "content": _OUTPUT}], reply=True)
    except Exception as err:
        raise ConfigError(
            f"env.tool_format=chat_template: the chat template of {who} declares tools but "
            f"cannot write a call or a tool message ({type(err).__name__}: {err}); {fix}."
        ) from None
    found = _call_tags(plain_turn, call_turn)
    if found is None or _OUTPUT not in tool_turn:
        raise ConfigError(
            f"env.tool_format=chat_template: the chat template of {who} does not write a call "
            "as a JSON object between a start and an end tag (as Qwen2.5's "
            "<tool_call>{json}</tool_call>), or drops tool messages, so rlcli cannot tell "
            f"where a call ends; {fix}."
        )
    return found


def _call_tags(plain_turn: str, call_turn: str) -> TemplateCalls | None:
    """The tags around the call in `call_turn` (the probe's assistant turn with a call), as
    the text after the turn's words less the text that closes a turn without one."""
    if plain_turn.count(_SAID) != 1 or call_turn.count(_SAID) != 1:
        return None
    turn_end = plain_turn.split(_SAID)[1]
    after = call_turn.split(_SAID)[1]
    if not after.endswith(turn_end):
        return None
    written = after[: len(after) - len(turn_end)]
    first, last = written.find("{"), written.rfind("}")
    if first < 0 or last < first:
        return None
    start, stop = written[:first].strip(), written[last + 1 :].strip()
    try:
        body = json.loads(written[first : last + 1])
    except json.JSONDecodeError:
        return None
    if not (start and stop and isinstance(body, dict)):
        return None
    names = [k for k, v in body.items() if v == _TOOL]
    arguments = [k for k, v in body.items() if _ARGUMENT in json.dumps(v)]
    if len(names) != 1 or len(arguments) != 1:
        return None
    return TemplateCalls(start, stop, names[0], arguments[0])
