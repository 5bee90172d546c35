"""Record datasets: the records of a local file, a saved folder or a hub split
(`rlcli.data.files`) turned into `Problem`s (`record_splits`), with the dotted field paths and
answer formats (`rlcli.data.answers`) each conf/data/*.yaml configures. A prompt field that
holds chat messages (TRL's conversational format) keeps the whole conversation: every field a
chat template reads, checked here so that one it cannot render is refused before a model loads.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass

from rlcli.config import ConfigError, DataConfig
from rlcli.data.answers import ANSWER_FORMATS
from rlcli.data.files import load_hub, read_file
from rlcli.data.problems import Problem, content_text, with_text

ROLES = ("system", "user", "assistant", "tool")  # the roles chat templates render


def _rows(table) -> Iterator[dict]:
    """A `datasets.Dataset`'s records as plain dicts, read in batches: DAPO-Math-17k on the
    hub has 1.8M rows, so only the problems kept after de-duplication are held."""
    for batch in table.iter(batch_size=1024):
        columns = list(batch)
        for values in zip(*batch.values(), strict=True):
            yield dict(zip(columns, values, strict=True))


def _present(record: dict, prefix: str = "") -> str:
    # Columnar readers fill a field a record lacks with None, so None counts as absent.
    return ", ".join(f"{prefix}{k}" for k, v in record.items() if v is not None) or "none"


class _MissingField(KeyError):
    """A dotted field path that a record does not have; `fields` lists what it does have."""

    def __init__(self, fields: str):
        super().__init__(fields)
        self.fields = fields


class _NullField(KeyError):
    """A dotted field path that reaches a null value; `at` is the path up to it."""

    def __init__(self, at: str):
        super().__init__(at)
        self.at = at


def field_value(record: dict, path: str):
    """`record[path]`, where a dotted path walks into nested records ("reward_model.ground_
    truth") and a number indexes a list ("prompt.0.content"). Raises _MissingField for a
    field the record lacks, _NullField for one that holds null (a columnar reader gives a row
    without a field that other rows have a null there, so the two cannot be told apart)."""
    if path in record:  # a top-level name, which may itself hold a dot
        if record[path] is None:
            raise _NullField(path)
        return record[path]
    value, prefix = record, ""
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            if value[part] is None:
                raise _NullField(f"{prefix}{part}")
            value, prefix = value[part], f"{prefix}{part}."
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value, prefix = value[int(part)], f"{prefix}{part}."
        else:
            fields = _present(value, prefix) if isinstance(value, dict) else "none"
            raise _MissingField(fields)
    return value


@dataclass(frozen=True)
class _Source:
    """Records from one file or hub split, with the name a user would recognise."""

    label: str  # e.g. "data.path=train.jsonl" or "hub dataset openai/gsm8k, split 'train'"
    split: str  # "train" or "test": part of every problem id
    table: object  # a datasets.Dataset


def _file_source(path: str, key: str, split: str) -> _Source:
    return _Source(f"data.{key}={path}", split, read_file(path, key))


def _hub_source(cfg: DataConfig, hub_split: str, split: str) -> _Source:
    label = f"hub dataset {cfg.hub_id}, split {hub_split!r}"
    return _Source(label, split, load_hub(cfg, hub_split))


def field_or_error(record: dict, key: str, cfg: DataConfig, where: str):
    """The record's value at the path `cfg.<key>` names; `where` ("row 3 of data.path=x")
    names the record in the ConfigError raised when it has no such field, or it is null."""
    path = getattr(cfg, key)
    try:
        return field_value(record, path)
    except _MissingField as err:
        raise ConfigError(
            f"There is no field {path!r} in {where} (fields present: {err.fields}); set "
            f"data.{key} to the field that holds it (a dotted path for nested fields)."
        ) from None
    except _NullField as err:
        inside = "" if err.at == path else f"{err.at!r} of "
        raise ConfigError(
            f"The field {inside}{path!r} (data.{key}) is null in {where} (fields present: "
            f"{_present(record)}); a row without the field, where other rows have it, reads as "
            "null too. Give every record a value there, or drop the records without one."
        ) from None


def _kind(value) -> str:
    """A value's type as a JSON file writes it, and the value, for error messages."""
    if value is None:
        return "null"
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    kind = kinds.get(type(value), "a number" if isinstance(value, int | float) else "a value")
    shown = json.dumps(value, default=str, ensure_ascii=False)
    return f"{kind} ({shown if len(shown) <= 60 else shown[:57] + '...'})"


# --- chat messages: what a chat template reads, checked before any model loads --------------


def chat_messages(value: list, field: str, where: str) -> list[dict]:
    """A list of chat messages (`field`: the data field that holds it, "prompt"), each kept
    whole; a ConfigError naming the row, the field and the valid choices for anything a chat
    template cannot render."""
    return [_message(item, f"{field}.{i}", where) for i, item in enumerate(value)]


def _message(item, at: str, where: str) -> dict:
    """One chat message, every field kept: role, content, and an assistant's tool_calls or a
    tool message's name and tool_call_id as the template reads them. A field that is null is
    dropped (a columnar reader fills a field some messages lack with null), but content."""
    if not isinstance(item, dict):
        raise ConfigError(
            f"In {where}, {at} is {_kind(item)}, not a chat message; give each message as an "
            'object: {"role": "user", "content": "..."}.'
        )
    message = {k: v for k, v in item.items() if v is not None or k == "content"}
    if message.get("role") not in ROLES:
        role = _kind(message["role"]) if "role" in message else "missing"
        raise ConfigError(
            f"In {where}, {at}.role is {role}, which is not a chat role: the valid roles are "
            f"{', '.join(ROLES)}."
        )
    for key in ("name", "tool_call_id"):
        if key in message and not isinstance(message[key], str):
            raise ConfigError(
                f"In {where}, {at}.{key} is {_kind(message[key])}; a message's {key} is text."
            )
    if "tool_calls" in message:
        _check_tool_calls(message, f"{at}.tool_calls", where)
    _check_content(message, f"{at}.content", where)
    return message


def _check_tool_calls(message: dict, at: str, where: str) -> None:
    calls = message["tool_calls"]
    if message["role"] != "assistant":
        raise ConfigError(
            f"In {where}, {at} is on a {message['role']} message; only an assistant message "
            "makes tool calls (the tool's reply is a message of role tool)."
        )
    if not isinstance(calls, list) or not all(isinstance(call, dict) for call in calls):
        raise ConfigError(
            f"In {where}, {at} is {_kind(calls)}; tool_calls is a list of calls, each an "
            'object: [{"type": "function", "function": {"name": ..., "arguments": {...}}}].'
        )


def _check_content(message: dict, at: str, where: str) -> None:
    content = message.get("content")
    if content is None:
        if message["role"] == "assistant" and message.get("tool_calls"):
            return  # a turn of calls alone: OpenAI's form, which templates render
        state = "null" if "content" in message else "missing"
        raise ConfigError(
            f"In {where}, {at} is {state}; only an assistant message with tool_calls may have "
            "no content: give the message its text, or a list of text parts."
        )
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise ConfigError(
            f"In {where}, {at} is {_kind(content)}; a message's content is text, or a list of "
            'text parts: [{"type": "text", "text": "..."}].'
        )
    for i, part in enumerate(content):
        _check_part(part, f"{at}.{i}", where)


def _check_part(part, at: str, where: str) -> None:
    if not isinstance(part, dict):
        raise ConfigError(
            f"In {where}, {at} is {_kind(part)}; a content part is an object: "
            '{"type": "text", "text": "..."}.'
        )
    if part.get("type") != "text":
        raise ConfigError(
            f"In {where}, {at}.type is {_kind(part.get('type'))}: the only valid content part "
            'is {"type": "text", "text": "..."}, as rlcli trains language models on text (an '
            "image or audio part would be lost); drop the part or give its text."
        )
    if not isinstance(part.get("text"), str):
        raise ConfigError(f"In {where}, {at}.text is {_kind(part.get('text'))}, not text.")


def _check_final(message: dict, at: str, where: str) -> None:
    """A conversation that ends with an assistant message is continued from its text (TRL's
    continue_final_message), so that text must be there."""
    if message["role"] == "assistant" and (
        message.get("tool_calls") or not content_text(message["content"]).strip()
    ):
        raise ConfigError(
            f"In {where}, the conversation ends with an assistant message ({at}) that holds "
            "no text to continue (tool calls, or empty content). End it with the user or tool "
            "message the model replies to, or an assistant message whose text the model goes "
            "on with."
        )


def _conversation(value: list, instruction: str, where: str, cfg: DataConfig) -> tuple[dict, ...]:
    """A prompt field's chat messages, whole, with `instruction` added to the last user
    message; a ConfigError naming the record when one cannot be rendered or there is no user
    message."""
    messages = chat_messages(value, cfg.prompt_field, where)
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if not users:
        raise ConfigError(
            f"In {where}, data.prompt_field={cfg.prompt_field} is a list with no user "
            "message; set data.prompt_field to the prompt text or messages."
        )
    _check_final(messages[-1], f"{cfg.prompt_field}.{len(messages) - 1}", where)
    last = messages[users[-1]]
    messages[users[-1]] = {**last, "content": with_text(last["content"], instruction, " ")}
    return tuple(messages)


def _prompt(record: dict, cfg: DataConfig, where: str) -> tuple[str, tuple[dict, ...] | None]:
    """The prompt's text (a conversation's last user message) and, when the prompt field holds
    chat messages, the conversation."""
    if cfg.template is not None:
        try:
            text = cfg.template.format(**record)
        except KeyError as err:
            raise ConfigError(
                f"data.template names the field {err.args[0]!r}, which {where} does not have "
                f"(fields present: {_present(record)})."
            ) from None
        except (IndexError, ValueError, AttributeError) as err:
            raise ConfigError(
                f"data.template={cfg.template!r} is not a format string over the record's "
                f"fields ({err}); name fields in braces, e.g. {{problem}}, and double literal "
                "braces, e.g. \\boxed{{}}."
            ) from None
        return f"{text} {cfg.instruction}".strip(), None
    value = field_or_error(record, "prompt_field", cfg, where)
    if isinstance(value, str):
        return f"{value} {cfg.instruction}".strip(), None
    if not isinstance(value, list):
        raise ConfigError(
            f"In {where}, data.prompt_field={cfg.prompt_field} is {_kind(value)}, not a prompt: "
            "a prompt is text or a list of chat messages; point data.prompt_field at the field "
            "that holds it (a dotted path reaches into a nested record), or give data.template."
        )
    conversation = _conversation(value, cfg.instruction, where, cfg)
    last_user = next(m for m in reversed(conversation) if m["role"] == "user")
    return content_text(last_user["content"]), conversation


def _answer(record: dict, cfg: DataConfig, where: str) -> str:
    if cfg.answer_field is None:  # prompt-only data: a reward that needs no answer
        return ""
    value = field_or_error(record, "answer_field", cfg, where)
    # A number is an answer as JSON datasets often write it (GSM8K's as 18); a boolean, an
    # object or a list would only be trained on as its Python text.
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ConfigError(
            f"In {where}, data.answer_field={cfg.answer_field} is {_kind(value)}, not an "
            "answer: an answer is text or a number; point data.answer_field at the field that "
            "holds it (a dotted path reaches into a nested record, e.g. "
            "reward_model.ground_truth)."
        )
    raw = str(value)
    answer = ANSWER_FORMATS[cfg.answer_format](raw)
    if answer is None:
        raise ConfigError(
            f"data.answer_format={cfg.answer_format} finds no answer in {where} "
            f"({cfg.answer_field}={raw[:80]!r}); set data.answer_format to how "
            f"the answers are written: {', '.join(sorted(ANSWER_FORMATS))} (plain = as is)."
        )
    return answer


def problem_from_record(record: dict, item_id: str, cfg: DataConfig, where: str) -> Problem:
    question, conversation = _prompt(record, cfg, where)
    return Problem(item_id, question, _answer(record, cfg, where), record, conversation)


def prompt_key(problem: Problem):
    """What makes two problems the same prompt for data.dedupe: the text, and the whole
    conversation where there is one (as JSON: a set holds no dicts or lists)."""
    return problem.question, json.dumps(problem.conversation, sort_keys=True, default=str)


def _items(source: _Source, cfg: DataConfig, to_item, key) -> list:
    """Every row as an item; with data.dedupe, only the first row of each `key(item)`."""
    items, seen = [], set()
    for row, record in enumerate(_rows(source.table)):
        item = to_item(
            record, f"{cfg.name}-{source.split}-{row}", cfg, f"row {row} of {source.label}"
        )
        if cfg.dedupe:
            if key(item) in seen:
                continue
            seen.add(key(item))
        items.append(item)
    return items


def _check_record_config(cfg: DataConfig) -> None:
    if not cfg.path and not cfg.hub_id:
        raise ConfigError(
            f"data={cfg.name} needs data.path=<.jsonl, .json, .parquet or .csv file> (or a Hugging "
            "Face dataset id in data.hub_id)."
        )
    if cfg.answer_format not in ANSWER_FORMATS:
        raise ConfigError(
            f"data.answer_format={cfg.answer_format!r} is not one of the valid choices: "
            f"{', '.join(sorted(ANSWER_FORMATS))}."
        )
    if cfg.limit is not None and cfg.limit < 1:
        raise ConfigError(f"data.limit={cfg.limit} must be >= 1, or null for every record.")
    if cfg.num_test < 0:
        raise ConfigError(f"data.num_test={cfg.num_test} must be >= 0.")


def _hold_out(train: list, cfg: DataConfig, label: str) -> tuple[list, list]:
    """`num_test` records held out of the training records after a seeded shuffle."""
    if cfg.num_test == 0:
        return train, []  # in the source's order
    if cfg.num_test >= len(train):
        raise ConfigError(
            f"data.num_test={cfg.num_test} would hold out all {len(train)} records of {label} "
            "and leave none for training: lower data.num_test or give data.test_path."
        )
    shuffled = list(train)
    random.Random(cfg.seed).shuffle(shuffled)
    return shuffled[cfg.num_test :], shuffled[: cfg.num_test]


def record_splits(
    cfg: DataConfig, to_item=problem_from_record, key=prompt_key
) -> tuple[list, list]:
    """Train and test items (Problems, or what `to_item(record, id, cfg, where)` makes) from
    records: the file `data.path`, else the hub's `train_split`. The test split is
    `data.test_path`, else the hub's `test_split` (hub only), else `num_test` records held
    out of the training records (after de-duplication by `key`, so no item is in both).
    `limit` then keeps a seeded subset of the training items."""
    _check_record_config(cfg)
    if cfg.path:
        train_source = _file_source(cfg.path, "path", "train")
    else:
        train_source = _hub_source(cfg, cfg.train_split, "train")
    train = _items(train_source, cfg, to_item, key)
    if cfg.test_path:
        test = _items(_file_source(cfg.test_path, "test_path", "test"), cfg, to_item, key)
    elif not cfg.path and cfg.test_split:
        test = _items(_hub_source(cfg, cfg.test_split, "test"), cfg, to_item, key)
    else:
        train, test = _hold_out(train, cfg, train_source.label)
    if cfg.limit is not None and cfg.limit < len(train):
        keep = sorted(random.Random(cfg.seed).sample(range(len(train)), cfg.limit))
        train = [train[i] for i in keep]
    return train, test
