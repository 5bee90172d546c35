"""Record datasets: a local .jsonl/.json/.parquet file or a Hugging Face hub dataset turned
into `Problem`s (`record_splits`), with the dotted field paths and answer formats
(`rlcli.data.answers`) each conf/data/*.yaml configures; and PPO-ptx's pretraining text
(`read_texts`).
"""

from __future__ import annotations

import codecs
import json
import random
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rlcli.config import ConfigError, DataConfig
from rlcli.data.answers import ANSWER_FORMATS
from rlcli.data.problems import Problem

# --- records: a local file or a hub dataset, turned into problems ---------------------------------


# File suffix -> the `datasets` builder that reads it.
FILE_READERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _local_file(path: str, key: str, kinds: str) -> Path:
    """The file config field `key` names (holding `kinds`, e.g. "a .jsonl file"); ConfigError
    when there is none, saying where a relative path led, or when it is a directory."""
    file = Path(path).expanduser()
    if file.is_dir():
        raise ConfigError(f"{key}={path} is a directory, not a file: give the path of {kinds}.")
    if not file.is_file():
        where = "" if file.is_absolute() else f" (looked for at {file.absolute()})"
        raise ConfigError(f"{key}={path}: no such file{where}. Give the path of {kinds}.")
    return file


def _check_utf8(file: Path, label: str) -> None:
    """ConfigError naming `label` ("data.path=x") and the line and column of the first byte of
    `file` that is not UTF-8. Read by 1 MiB blocks, as a data file may be large (pyarrow does
    not check the bytes of strings: such a file would load, then fail when read)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        with file.open("rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                decoder.decode(block)
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        # surrogateescape keeps each bad byte as one character, U+DC80-U+DCFF.
        text = file.read_bytes().decode("utf-8", "surrogateescape")
        at = re.search("[\udc80-\udcff]", text).start()
        line, column = text.count("\n", 0, at) + 1, at - text.rfind("\n", 0, at)
        raise ConfigError(
            f"{label}: line {line} is not UTF-8 text (byte 0x{ord(text[at]) - 0xDC00:02x} at "
            f"column {column}); save the file as UTF-8."
        ) from None


def _json_problem(text: str) -> str | None:
    """Where `text` stops being JSON records (objects one after another, or lists of them), as
    "line L ..."; else None. After `datasets` failed: its errors give byte offsets or rows."""
    decoder, space = json.JSONDecoder(), re.compile(r"\s*")
    pos = space.match(text).end()
    while pos < len(text):
        start = pos
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as err:
            msg = err.msg.removesuffix(" at")  # "Invalid control character at"
            return f"line {err.lineno} is not valid JSON ({msg} at column {err.colno})"
        if not all(isinstance(v, dict) for v in (value if isinstance(value, list) else [value])):
            line = text.count("\n", 0, start) + 1
            return f"line {line} holds a JSON {type(value).__name__}, not a record (an object)"
        pos = space.match(text, pos).end()
    return None


@contextmanager
def _no_progress_bars() -> Iterator[None]:
    """`datasets` draws a bar on the console for each file it reads or prepares ("Generating
    train split"); rlcli's own lines and bar are what a user should see, so they are off
    while it loads (and as they were after)."""
    from datasets.utils import logging as datasets_logging

    was_on = datasets_logging.is_progress_bar_enabled()
    datasets_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            datasets_logging.enable_progress_bar()


def _read_file(path: str, key: str):
    """A local file as a `datasets.Dataset`; `key` names the config field for messages."""
    import datasets  # here, not at the top: it takes ~0.6 s, and generated data never needs it

    file = _local_file(path, f"data.{key}", "a .jsonl, .json or .parquet file")
    reader = FILE_READERS.get(file.suffix.lower())
    if reader is None:
        raise ConfigError(
            f"data.{key}={path} has the suffix {file.suffix!r}, which rlcli cannot read: use a "
            ".jsonl or .json file (JSON objects) or a .parquet file."
        )
    empty = ConfigError(f"data.{key}={path} holds no records: the file is empty.")
    if reader == "json":
        _check_utf8(file, f"data.{key}={path}")
    try:
        with _no_progress_bars():
            table = datasets.load_dataset(reader, data_files=str(file), split="train")
    except Exception as err:  # datasets and pyarrow raise many types; all mean "unreadable"
        if not file.read_bytes().strip():
            raise empty from None
        if reader == "json" and (problem := _json_problem(file.read_text("utf-8-sig"))):
            raise ConfigError(
                f"data.{key}={path}: {problem}. A .jsonl file holds one JSON object per record, "
                "a .json file a list of them."
            ) from None
        # `datasets` wraps the cause in a DatasetGenerationError that says only that.
        cause = _first_line(err.__cause__ or err)
        raise ConfigError(
            f"data.{key}={path} could not be read as {reader} records: {cause}"
        ) from None
    if len(table) == 0:
        raise empty
    return table


def _load_hub(cfg: DataConfig, split: str):
    import datasets

    config = f"config {cfg.hub_config}, " if cfg.hub_config else ""
    try:
        with _no_progress_bars():
            return datasets.load_dataset(cfg.hub_id, cfg.hub_config, split=split)
    except Exception as err:  # no network, unknown id, config or split: all need the same fix
        raise ConfigError(
            f"data.hub_id={cfg.hub_id} ({config}split {split!r}) could not be loaded from the "
            f"Hugging Face hub: {_first_line(err)}. If this machine has no "
            f"network access, download the dataset where there is (`hf download {cfg.hub_id} "
            "--repo-type dataset --local-dir DIR`) and point data.path (and data.test_path) "
            "at its local .parquet or .jsonl files."
        ) from None


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


def prompt_text(value) -> str | None:
    """A prompt field's text: a string as it is; a list of chat messages gives the content of
    its last user message (None when it has no user message)."""
    if isinstance(value, list):
        users = [m for m in value if isinstance(m, dict) and m.get("role") == "user"]
        return str(users[-1].get("content", "")) if users else None
    return str(value)


@dataclass(frozen=True)
class _Source:
    """Records from one file or hub split, with the name a user would recognise."""

    label: str  # e.g. "data.path=train.jsonl" or "hub dataset openai/gsm8k, split 'train'"
    split: str  # "train" or "test": part of every problem id
    table: object  # a datasets.Dataset


def _file_source(path: str, key: str, split: str) -> _Source:
    return _Source(f"data.{key}={path}", split, _read_file(path, key))


def _hub_source(cfg: DataConfig, hub_split: str, split: str) -> _Source:
    label = f"hub dataset {cfg.hub_id}, split {hub_split!r}"
    return _Source(label, split, _load_hub(cfg, hub_split))


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


def _question(record: dict, cfg: DataConfig, where: str) -> str:
    if cfg.template is None:
        text = prompt_text(field_or_error(record, "prompt_field", cfg, where))
        if text is None:
            raise ConfigError(
                f"In {where}, data.prompt_field={cfg.prompt_field} is a list with no user "
                "message; set data.prompt_field to the prompt text or messages."
            )
    else:
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
    return f"{text} {cfg.instruction}".strip()


def _answer(record: dict, cfg: DataConfig, where: str) -> str:
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
    return Problem(item_id, _question(record, cfg, where), _answer(record, cfg, where), record)


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
            f"data={cfg.name} needs data.path=<.jsonl, .json or .parquet file> (or a Hugging "
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
    cfg: DataConfig, to_item=problem_from_record, key=lambda p: p.question
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


def read_texts(path: str) -> list[str]:
    """Pretraining text for PPO-ptx: a .jsonl file's `text` fields, or one text per line."""
    file = _local_file(path, "algo.ptx_path", "a text file (one text a line) or a .jsonl file")
    label = f"algo.ptx_path={path}"
    _check_utf8(file, label)
    text = file.read_text("utf-8-sig")
    if file.suffix == ".jsonl":
        lines = enumerate(text.split("\n"), 1)
        texts = [_text_field(line, n, label) for n, line in lines if line.strip()]
    else:
        texts = [line for line in text.splitlines() if line.strip()]
    if not texts:
        raise ConfigError(f"{label} holds no text.")
    return texts


def _text_field(line: str, number: int, label: str) -> str:
    try:
        text = json.loads(line).get("text")
    except (json.JSONDecodeError, AttributeError):  # not JSON, or JSON but not an object
        text = None
    if not isinstance(text, str):
        raise ConfigError(
            f"{label}: line {number} is not a JSON object with a 'text' string; a .jsonl file "
            'holds one a line, e.g. {"text": "..."}.'
        )
    return text
