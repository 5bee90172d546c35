"""Record datasets: the records of a local file, a saved folder or a hub split
(`rlcli.data.files`) turned into `Problem`s (`record_splits`), with the dotted field paths and
answer formats (`rlcli.data.answers`) each conf/data/*.yaml configures. A prompt field that
holds chat messages (TRL's conversational format) keeps the whole conversation.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from rlcli.config import ConfigError, DataConfig
from rlcli.data.answers import ANSWER_FORMATS
from rlcli.data.files import load_hub, read_file
from rlcli.data.problems import Problem


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


def field_value(record: dict, path: str):
    """`record[path]`, where a dotted path walks into nested records ("reward_model.ground_
    truth") and a number indexes a list ("prompt.0.content"). Raises _MissingField."""
    if record.get(path) is not None:  # a top-level name that itself holds a dot
        return record[path]
    value, prefix = record, ""
    for part in path.split("."):
        if isinstance(value, dict) and value.get(part) is not None:
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
    names the record in the ConfigError raised when it has no such field."""
    path = getattr(cfg, key)
    try:
        return field_value(record, path)
    except _MissingField as err:
        raise ConfigError(
            f"There is no field {path!r} in {where} (fields present: {err.fields}); set "
            f"data.{key} to the field that holds it (a dotted path for nested fields)."
        ) from None


def _conversation(value: list, instruction: str, where: str, cfg: DataConfig) -> tuple[dict, ...]:
    """A prompt field's chat messages, `instruction` added to the last user message; a
    ConfigError naming the record when it has no user message or an item is not
    {"role": ..., "content": ...}."""
    if not any(isinstance(m, dict) and m.get("role") == "user" for m in value):
        raise ConfigError(
            f"In {where}, data.prompt_field={cfg.prompt_field} is a list with no user "
            "message; set data.prompt_field to the prompt text or messages."
        )
    messages = [m for m in value if isinstance(m, dict) and "role" in m and "content" in m]
    if len(messages) != len(value):
        raise ConfigError(
            f"In {where}, data.prompt_field={cfg.prompt_field} is a list whose items are not all "
            'chat messages ({"role": ..., "content": ...}); give the prompt as text or as such '
            "messages."
        )
    messages = [{"role": str(m["role"]), "content": str(m["content"])} for m in messages]
    last = max(i for i, m in enumerate(messages) if m["role"] == "user")
    messages[last]["content"] = f"{messages[last]['content']} {instruction}".strip()
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
    if not isinstance(value, list):
        return f"{value} {cfg.instruction}".strip(), None
    conversation = _conversation(value, cfg.instruction, where, cfg)
    question = next(m["content"] for m in reversed(conversation) if m["role"] == "user")
    return question, conversation


def _answer(record: dict, cfg: DataConfig, where: str) -> str:
    if cfg.answer_field is None:  # prompt-only data: a reward that needs no answer
        return ""
    raw = str(field_or_error(record, "answer_field", cfg, where))
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
    conversation where there is one (as pairs: a set holds no dicts)."""
    turns = tuple((m["role"], m["content"]) for m in problem.conversation or ())
    return problem.question, turns


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
