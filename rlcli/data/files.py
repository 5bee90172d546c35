"""Reading records: a local .jsonl/.json/.parquet/.csv file, a folder written by `datasets`'
save_to_disk, or a Hugging Face hub split, as a `datasets.Dataset` (`read_file`, `load_hub`),
with a one-paragraph error naming the field and the fix for every way that fails; and PPO-ptx's
pretraining text (`read_texts`).
"""

from __future__ import annotations

import codecs
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


def _saved_dataset(folder: Path, label: str, split: str):
    """A folder written by `datasets`' save_to_disk: a Dataset, or a DatasetDict's `split`
    (train for data.path, test for data.test_path)."""
    import datasets

    try:
        with _no_progress_bars():
            saved = datasets.load_from_disk(str(folder))
    except Exception as err:  # a half-written or foreign folder: the same fix either way
        why = first_line(err)
        raise ConfigError(f"{label} could not be read as a saved dataset: {why}") from None
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
    import datasets  # here, not at the top: it takes ~0.6 s, and generated data never needs it

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
    empty = ConfigError(f"data.{key}={path} holds no records: the file is empty.")
    if reader in ("json", "csv"):
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
        cause = first_line(err.__cause__ or err)
        raise ConfigError(
            f"data.{key}={path} could not be read as {reader} records: {cause}"
        ) from None
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
