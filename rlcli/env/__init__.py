"""Multi-turn episodes with tools (`env=calculator`, `python`, `search`; `env=none` is one
reply per prompt).

The room below the prompts (`data`, whose system message names the tools) and the samplers
(`rollout`, which run the episodes): how a tool call is written and read (`calls`), the tools
and `TOOLS` (`tools`), the python tool's sandboxed process (`sandbox`, and `sandbox_child`, the
script that process runs), and an episode's turns, tokens and loss mask (`episode`). Nothing
here knows an engine or a model: a sampler hands `episode.run_episodes` a function that
continues token contexts.
"""

from __future__ import annotations

from rlcli.config import Config


def system_prompt(cfg: Config) -> str | None:
    """The system message of every prompt: `data.system_prompt`, then the tool instructions
    of `env.instructions` (with the tools' lines in place of `{tools}`) when tools are on."""
    base, env = cfg.data.system_prompt, cfg.env
    if env.name == "none" or not env.instructions:
        return base
    from rlcli.env.tools import describe_tools

    text = env.instructions.replace("{tools}", describe_tools(env.tools))
    return text if base is None else f"{base}\n\n{text}"


def response_budget(cfg: Config) -> int:
    """Most tokens after the prompt: one reply's (sampler.max_new_tokens), or a whole
    episode's with tools (env.max_tokens); Dr. GRPO's and DAPO's length terms use it."""
    return cfg.sampler.max_new_tokens if cfg.env.name == "none" else cfg.env.max_tokens
