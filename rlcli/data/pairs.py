"""Preference pairs for DPO (`data=pairs`): a `Pair` is a prompt (chat messages up to the
reply), a chosen and a rejected response.

The records may be plain text (`{"prompt": str, "chosen": str, "rejected": str}`) or chat form
(prompt, chosen and rejected as lists of `{"role", "content"}` messages; without a prompt
field, the chosen conversation minus its last message is the prompt, as in Anthropic-HH).
`rlcli pairs` (rlcli/pairs.py) makes such records on-policy; `check_pairs` is the checks of its
`pairs` section.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlcli.config import ConfigError, DataConfig, PairsConfig


@dataclass(frozen=True)
class Pair:
    """One preference: `chosen` is the better reply to `prompt` than `rejected`."""

    id: str
    prompt: list[dict]  # chat messages, ending before the reply
    chosen: str
    rejected: str


def as_messages(value) -> list[dict] | None:
    """A prompt as chat messages: a string is one user message."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, list) and all(isinstance(m, dict) and "content" in m for m in value):
        return [{"role": m.get("role", "user"), "content": str(m["content"])} for m in value]
    return None


def reply_text(value) -> str | None:
    """A reply's text: a string, or the content of the last message of a conversation."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and isinstance(value[-1], dict):
        return str(value[-1].get("content", ""))
    return None


def pair_from_record(record: dict, item_id: str, cfg: DataConfig, where: str) -> Pair:
    """The Pair of one record; `where` ("row 3 of data.path=...") names it in errors."""
    from rlcli.data.records import field_or_error

    chosen_raw = field_or_error(record, "chosen_field", cfg, where)
    rejected_raw = field_or_error(record, "rejected_field", cfg, where)
    try:
        prompt = as_messages(field_or_error(record, "prompt_field", cfg, where))
    except ConfigError:
        if not (isinstance(chosen_raw, list) and len(chosen_raw) > 1):
            raise
        prompt = as_messages(chosen_raw[:-1])  # implicit prompt: the shared conversation
    chosen, rejected = reply_text(chosen_raw), reply_text(rejected_raw)
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
