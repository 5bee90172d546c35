"""Preference pairs for DPO (`data=pairs`): a `Pair` is a prompt (chat messages up to the
reply), a chosen and a rejected response.

The records may be plain text (`{"prompt": str, "chosen": str, "rejected": str}`) or chat form
(prompt, chosen and rejected as lists of `{"role", "content"}` messages, kept whole with their
tool calls; without a prompt field, the chosen conversation minus its last message is the
prompt, as in Anthropic-HH).
`rlcli pairs` (rlcli/commands/make_pairs.py) makes such records on-policy; `check_pairs` is
the checks of its `pairs` section.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlcli.config import ConfigError, DataConfig, PairsConfig
from rlcli.data.problems import content_text


@dataclass(frozen=True)
class Pair:
    """One preference: `chosen` is the better reply to `prompt` than `rejected`."""

    id: str
    prompt: list[dict]  # chat messages, ending before the reply, each as the data gives it
    chosen: str
    rejected: str


def as_messages(value, field: str, where: str) -> list[dict] | None:
    """A prompt as chat messages, each kept whole (`field` holds it, `where` names the record
    in the ConfigError for one a chat template cannot render): a string is one user message.
    None for a value that is neither, or no messages."""
    from rlcli.data.records import chat_messages

    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, list) and value:
        return chat_messages(value, field, where)
    return None


def reply_text(value, field: str, where: str) -> str | None:
    """A reply's text: a string, or the content of the last message of a conversation."""
    from rlcli.data.records import chat_messages

    if isinstance(value, str):
        return value
    if isinstance(value, list) and value:
        return content_text(chat_messages(value, field, where)[-1]["content"])
    return None


def pair_from_record(record: dict, item_id: str, cfg: DataConfig, where: str) -> Pair:
    """The Pair of one record; `where` ("row 3 of data.path=...") names it in errors."""
    from rlcli.data.records import field_or_error

    chosen_raw = field_or_error(record, "chosen_field", cfg, where)
    rejected_raw = field_or_error(record, "rejected_field", cfg, where)
    try:
        prompt_raw = field_or_error(record, "prompt_field", cfg, where)
    except ConfigError:
        if not (isinstance(chosen_raw, list) and len(chosen_raw) > 1):
            raise
        # implicit prompt: the shared conversation
        prompt = as_messages(chosen_raw[:-1], cfg.chosen_field, where)
    else:
        prompt = as_messages(prompt_raw, cfg.prompt_field, where)
    chosen = reply_text(chosen_raw, cfg.chosen_field, where)
    rejected = reply_text(rejected_raw, cfg.rejected_field, where)
    if prompt is None or chosen is None or rejected is None:
        raise ConfigError(
            f"In {where}, the prompt, chosen and rejected fields must each be text or a list of "
            f"chat messages with a 'content' (data.prompt_field={cfg.prompt_field}, "
            f"data.chosen_field={cfg.chosen_field}, data.rejected_field={cfg.rejected_field})."
        )
    if cfg.system_prompt is not None and prompt[0]["role"] != "system":
        prompt = [{"role": "system", "content": cfg.system_prompt}, *prompt]
    return Pair(item_id, prompt, chosen, rejected)


def check_pairs(pairs: PairsConfig) -> None:
    """A ConfigError for `rlcli pairs` settings that cannot make a pair."""
    if pairs.k < 2 or pairs.prompts_per_batch < 1:
        raise ConfigError(
            f"pairs.k={pairs.k} must be >= 2 (a pair needs two responses to compare) and "
            f"pairs.prompts_per_batch={pairs.prompts_per_batch} >= 1."
        )
