"""Multi-turn episodes with tools (`env=calculator`, `python`, `search`; `env=none` is one
reply per prompt).

The room below the prompts (`data`, whose system message names the tools) and the samplers
(`rollout`, which run the episodes): how a tool call is written and read (`calls`, rlcli's own
tags; `chat_template`, the model's template's), the tools and `TOOLS` (`tools`), the python
tool's sandboxed process (`sandbox`, `sandbox_child`), and an episode's turns, tokens, loss
mask and transcript (`episode`). Nothing here knows an engine or a model: a sampler hands
`episode.run_episodes` a function that continues token contexts.
"""

from __future__ import annotations

from rlcli.config import EnvConfig, SamplerConfig


def system_prompt(base: str | None, env: EnvConfig) -> str | None:
    """The system message of every prompt: `base` (data.system_prompt), then the tool instructions
    of `env.instructions` (with the tools' lines in place of `{tools}`) when tools are on in
    rlcli's format (with env.tool_format=chat_template the template declares the tools)."""
    text = tool_instructions(env)
    if text is None:
        return base
    return text if base is None else f"{base}\n\n{text}"


def tool_instructions(env: EnvConfig) -> str | None:
    """`env.instructions` with the tools' lines in place of `{tools}`, when tools are on in
    rlcli's format; None otherwise."""
    if env.name == "none" or not env.instructions or env.tool_format == "chat_template":
        return None
    from rlcli.env.tools import describe_tools

    return env.instructions.replace("{tools}", describe_tools(env.tools))


def prompt_tools(env: EnvConfig, tokenizer) -> list[dict] | None:
    """The tools' JSON schemas that every prompt declares through the chat template
    (env.tool_format=chat_template), once the template is seen to take them (else a
    ConfigError naming the model); None when the prompt declares no tools."""
    if env.name == "none" or env.tool_format != "chat_template":
        return None
    from rlcli.env.chat_template import template_calls, tool_schemas

    template_calls(tokenizer)
    return tool_schemas(env.tools)


def call_format(env: EnvConfig, tokenizer):
    """How the model writes a call (`env.calls.CallFormat`): rlcli's tags, or its chat
    template's format read from the template."""
    if env.tool_format == "chat_template":
        from rlcli.env.chat_template import template_calls

        return template_calls(tokenizer)
    from rlcli.env.calls import RLCLI_CALLS

    return RLCLI_CALLS


def response_budget(sampler: SamplerConfig, env: EnvConfig) -> int:
    """Most tokens after the prompt: one reply's (sampler.max_new_tokens), or a whole
    episode's with tools (env.max_tokens); Dr. GRPO's and DAPO's length terms use it."""
    return sampler.max_new_tokens if env.name == "none" else env.max_tokens
