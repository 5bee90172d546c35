"""Reading records: a local .jsonl/.json/.parquet/.csv file, a folder written by `datasets`'
save_to_disk, or a Hugging Face hub split, as a `datasets.Dataset` (`read_file`, `load_hub`),
with a one-paragraph error naming the field and the fix for every way that fails; and PPO-ptx's
pretraining text (`read_texts`).
"""

from __future__ import annotations

import codecs
import csv
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rlcli.config import ConfigError, DataConfig

# File suffix -> the `datasets` builder that reads it.
FILE_READERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
# What datasets' save_to_disk writes beside the data: a Dataset's, then a DatasetDict's.
SAVED_MARKERS = ("state.json", "dataset_dict.json")
KINDS = "a .jsonl, .json, .parquet or .csv file, or a folder saved by datasets' save_to_disk"
DAMAGED_PARQUET = (
    " The file is cut short or is not parquet: write it again (datasets' Dataset.to_parquet "
    "or pandas' DataFrame.to_parquet), or give the records as .jsonl."
)


def first_line(err: BaseException) -> str:
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


# What a JSON file must hold, said after each way one does not.
JSON_FORM = "A .jsonl file holds one JSON object per record, a .json file a list of them."
# JSON's own whitespace between values (not Python's \s, which takes more).
_JSON_SPACE = re.compile(r"[ \t\n\r]*")
# What each JSON value that is not a record is called in messages.
_JSON_KINDS = {list: "list", str: "string", int: "number", float: "number", bool: "boolean",
               type(None): "null"}  # fmt: skip


def _json_values(text: str) -> Iterator[tuple[int, object, bool]]:
    """Each value of `text` that should be a record, as (where it starts, the value, whether
    it is an item of a list): the values one after another (.jsonl), and the items of each
    list among them (a .json file's). Raises json.JSONDecodeError where `text` is not JSON."""
    decoder, pos = json.JSONDecoder(), _JSON_SPACE.match(text).end()
    while pos < len(text):
        if text[pos] == "[":
            pos = yield from _list_items(decoder, text, pos)
        else:
            value, end = decoder.raw_decode(text, pos)
            yield pos, value, False
            pos = end
        pos = _JSON_SPACE.match(text, pos).end()


def _list_items(decoder: json.JSONDecoder, text: str, pos: int):
    """Yields the items of the JSON list opening at `pos` as `_json_values` does; returns where
    the list ends."""
    pos = _JSON_SPACE.match(text, pos + 1).end()
    if text.startswith("]", pos):
        return pos + 1
    while True:
        value, end = decoder.raw_decode(text, pos)
        yield pos, value, True
        pos = _JSON_SPACE.match(text, end).end()
        if text.startswith("]", pos):
            return pos + 1
        if not text.startswith(",", pos):
            raise json.JSONDecodeError("Expecting ',' delimiter", text, pos)
        pos = _JSON_SPACE.match(text, pos + 1).end()


def _check_json(file: Path, label: str) -> None:
    """ConfigError naming `label` ("data.path=x") and the line where `file` stops being JSON
    records: objects one after another (.jsonl), or lists of them (.json). Checked before
    `datasets` reads it, which reads a null line as a record of nulls and a list of numbers
    as a column named `text`, and whose errors give byte offsets or row numbers."""
    text, records = file.read_text("utf-8-sig"), 0
    try:
        for start, value, in_list in _json_values(text):
            if not isinstance(value, dict):
                line = text.count("\n", 0, start) + 1
                where = " inside a list" if in_list else ""
                kind = _JSON_KINDS.get(type(value), type(value).__name__)
                raise ConfigError(
                    f"{label}: line {line} holds a JSON {kind}{where}, not a record (an "
                    f"object). {JSON_FORM}"
                )
            records += 1
    except json.JSONDecodeError as err:
        msg = err.msg.removesuffix(" at")  # "Invalid control character at"
        raise ConfigError(
            f"{label}: line {err.lineno} is not valid JSON ({msg} at column {err.colno}). "
            f"{JSON_FORM}"
        ) from None
    if records == 0 and text.strip():
        raise ConfigError(f"{label} holds no records: the file holds only an empty list.")


# What a CSV file must hold, said after each way one does not.
CSV_FORM = (
    "In a CSV file the first line names the columns and each line after it is a row with one "
    "value per column, separated by commas; a value holding a comma, a double quote or a line "
    'break is written in double quotes, each double quote inside it doubled ("Is 1,000 a '
    '""round"" number?"). Fix the file, or write the records as .jsonl.'
)


@contextmanager
def _csv_fields_of_any_size() -> Iterator[None]:
    """Python's csv refuses a value over 128 KiB by default; a record's text may be longer."""
    limit = csv.field_size_limit(2**31 - 1)
    try:
        yield
    finally:
        csv.field_size_limit(limit)


def _shown_row(row: list[str]) -> str:
    """A row's values as a message shows them: each repr'd, the whole cut at 100 characters."""
    text = ", ".join(repr(value) for value in row)
    return text if len(text) <= 100 else text[:97] + "..."


def _check_csv(file: Path, label: str) -> None:
    """ConfigError naming `label` and the line of the first row of `file` that CSV does not read
    cleanly: a quoted value never closed, text after a value's closing quote, or a row with more
    or fewer values than the header has columns. pandas (which `datasets` reads CSV with)
    reads each as data: rows merged into one value, a column shifted, a missing value null.
    Blank lines are skipped, as pandas skips them."""
    header, header_line, rows, end = None, 0, 0, 0  # `end`: the line the last row ended on
    with _csv_fields_of_any_size(), file.open(newline="", encoding="utf-8-sig") as stream:
        reader = csv.reader(stream, strict=True)
        try:
            for row in reader:
                start, end = end + 1, reader.line_num
                if not "".join(row).strip():
                    continue
                if header is None:
                    header, header_line = row, start
                elif len(row) != len(header):
                    raise ConfigError(_field_count_message(label, start, row, header, header_line))
                else:
                    rows += 1
        except csv.Error as err:
            raise ConfigError(_csv_syntax_message(label, end + 1, reader.line_num, err)) from None
    if header is not None and rows == 0:
        raise ConfigError(
            f"{label} holds no records: the header (line {header_line}: {', '.join(header)}) "
            "has no rows under it."
        )


def _field_count_message(label: str, line: int, row: list[str], header: list[str],
                         header_line: int) -> str:  # fmt: skip
    """Row `row` on `line` has more or fewer values than `header` (on `header_line`) names."""
    why = (
        "a comma inside a value that is not in double quotes splits it in two"
        if len(row) > len(header)
        else "a value is missing, or a line break inside a value that is not in double quotes "
        "ends the row early"
    )
    values = f"{len(row)} value{'s' * (len(row) != 1)} ({_shown_row(row)})"
    return (
        f"{label}: line {line} has {values} where the header (line {header_line}) has "
        f"{len(header)} columns ({', '.join(header)}); most likely {why}. {CSV_FORM}"
    )


def _csv_syntax_message(label: str, start: int, line: int, err: csv.Error) -> str:
    """What `err`, raised by Python's csv on `line` in the row that starts on `start`, means."""
    if str(err) == "unexpected end of data":
        what = (
            f"the row that starts on line {start} opens a double-quoted value that is never "
            "closed: the file ends inside it"
        )
    elif str(err).endswith("expected after '\"'") and start < line:
        what = (
            f"a double-quoted value opened in the row on line {start} runs on to line {line}, "
            "where its closing quote has more text after it: most likely a quote on line "
            f"{start} is never closed, and the lines between were read into that one value"
        )
    elif str(err).endswith("expected after '\"'"):
        what = f"line {line} has text after the closing quote of a double-quoted value"
    else:
        what = f"line {line} cannot be read as CSV ({err})"
    return f"{label}: {what}. {CSV_FORM}"


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


def _saved_folder_problem(folder: Path, err: Exception) -> str:
    """What is wrong with a save_to_disk `folder` that `datasets` failed (`err`) to read: the
    file missing, or the JSON file that is not JSON (its own error names neither)."""
    for name in (*SAVED_MARKERS, "dataset_info.json"):
        try:
            json.loads((folder / name).read_text("utf-8"))
        except FileNotFoundError:
            continue
        except json.JSONDecodeError as bad:
            return (
                f"its {name} is not valid JSON ({bad.msg} at line {bad.lineno}, column {bad.colno})"
            )
        except (OSError, ValueError) as bad:  # unreadable, or not UTF-8
            return f"its {name} cannot be read ({first_line(bad)})"
    if isinstance(err, FileNotFoundError) and err.filename:
        return f"its file {Path(err.filename).name} is missing"
    return first_line(err).rstrip(".")


def _saved_dataset(folder: Path, label: str, split: str):
    """A folder written by `datasets`' save_to_disk: a Dataset, or a DatasetDict's `split`
    (train for data.path, test for data.test_path)."""
    import datasets

    try:
        with _no_progress_bars():
            saved = datasets.load_from_disk(str(folder))
    except Exception as err:  # a half-written or foreign folder: the same fix either way
        why = _saved_folder_problem(folder, err)
        raise ConfigError(
            f"{label} could not be read as a saved dataset: {why}. The folder is incomplete or "
            "damaged (a save_to_disk cut short, or files removed or edited since): save the "
            "dataset again with save_to_disk, or give its records as a .jsonl or .parquet file."
        ) from None
    if isinstance(saved, datasets.DatasetDict):
        if split not in saved:
            raise ConfigError(
                f"{label} holds the splits {', '.join(saved)}, not {split!r}: point data.path at "
                "the train split's folder (and data.test_path at the test split's), e.g. "
                f"{folder / next(iter(saved))}."
            )
        saved = saved[split]
    if len(saved) == 0:
        raise ConfigError(f"{label} holds no records.")
    return saved


def read_file(path: str, key: str):
    """A local file (or a save_to_disk folder) as a `datasets.Dataset`; `key` names the config
    field for messages."""
    # Here, not at the top: it is slow to import (see docs/performance.md, "Start-up: what is
    # imported late"), and generated data never needs it.
    import datasets

    folder = Path(path).expanduser()
    if folder.is_dir() and any((folder / n).is_file() for n in SAVED_MARKERS):
        return _saved_dataset(folder, f"data.{key}={path}", "train" if key == "path" else "test")
    file = _local_file(path, f"data.{key}", KINDS)
    reader = FILE_READERS.get(file.suffix.lower())
    if reader is None:
        raise ConfigError(
            f"data.{key}={path} has the suffix {file.suffix!r}, which rlcli cannot read: use a "
            ".jsonl or .json file (JSON objects), a .parquet or .csv file, or a folder saved by "
            "datasets' save_to_disk."
        )
    label = f"data.{key}={path}"
    empty = ConfigError(f"{label} holds no records: the file is empty.")
    if reader in ("json", "csv"):
        _check_utf8(file, label)
        (_check_json if reader == "json" else _check_csv)(file, label)
    try:
        with _no_progress_bars():
            table = datasets.load_dataset(reader, data_files=str(file), split="train")
    except Exception as err:  # datasets and pyarrow raise many types; all mean "unreadable"
        if not file.read_bytes().strip():
            raise empty from None
        # `datasets` wraps the cause in a DatasetGenerationError that says only that.
        cause = first_line(err.__cause__ or err)
        fix = DAMAGED_PARQUET if reader == "parquet" else ""
        why = f"{cause.rstrip('.')}.{fix}"
        raise ConfigError(f"{label} could not be read as {reader} records: {why}") from None
    if len(table) == 0:
        raise empty
    return table


def load_hub(cfg: DataConfig, split: str):
    import datasets

    config = f"config {cfg.hub_config}, " if cfg.hub_config else ""
    try:
        with _no_progress_bars():
            return datasets.load_dataset(cfg.hub_id, cfg.hub_config, split=split)
    except Exception as err:  # no network, unknown id, config or split: all need the same fix
        raise ConfigError(
            f"data.hub_id={cfg.hub_id} ({config}split {split!r}) could not be loaded from the "
            f"Hugging Face hub: {first_line(err)}. If this machine has no "
            f"network access, download the dataset where there is (`hf download {cfg.hub_id} "
            "--repo-type dataset --local-dir DIR`) and point data.path (and data.test_path) "
            "at its local .parquet or .jsonl files."
        ) from None


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
