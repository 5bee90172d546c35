"""Input read strictly, and nothing left behind when it is refused.

- A data file whose rows do not parse cleanly (a CSV quote never closed, a row with more or
  fewer values than the header, a JSON line that is not a record, a damaged save_to_disk
  folder or parquet file) is refused in one paragraph naming the file and the line; pandas
  and pyarrow would read most of them as data (rows merged into one prompt, nulls filled in).
- A value with characters Hydra's grammar takes only quoted (a path /tmp/dätä_路径/prøb.jsonl,
  runs/rün) is read as written: rlcli quotes it for Hydra.
- A command whose config fails validation removes the run directory it made (Hydra makes it
  before the job validates), and never one that existed before.
"""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import datasets
import pytest

from rlcli.cli import main
from rlcli.commands.sweep import job_dirname
from rlcli.config import ConfigError
from rlcli.config.overrides import check_syntax, quote_for_hydra
from rlcli.data import load_splits
from rlcli.lifecycle import run_dir as run_dirs
from rlcli.tracking.console import job_log
from rlcli.validate import section
from tests.conftest import REPO, tiny

TINY = tiny("trainer.max_steps=1", "trainer.prompts_per_step=2", "trainer.group_size=2")
GOOD = '{"question": "What is 1 + 1?", "answer": "2"}\n'


def records(path: Path) -> list[tuple[str, str]]:
    """The (question, answer) of each training record `data=jsonl data.path=path` reads."""
    train, _ = load_splits(section("data", "jsonl", path=str(path), num_test=0))
    return [(p.question, p.answer) for p in train]


def refusal(path: Path, content: str | bytes) -> str:
    """The message with which reading `content`, written to `path`, is refused."""
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    with pytest.raises(ConfigError) as err:
        records(path)
    return str(err.value)


def rlcli(capsys, *argv: str) -> tuple[int, str]:
    """`rlcli train TINY argv` in this process: (exit code, stderr)."""
    try:
        main(["train", *TINY, *argv])
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    return code, capsys.readouterr().err


# --- CSV -------------------------------------------------------------------------------------


def test_a_csv_quote_never_closed_is_refused_naming_its_line(tmp_path):
    # pandas read this as three rows, the second 'What is 1+3?,4\nWhat is 2+2?"' (exit 0).
    path = tmp_path / "q.csv"
    message = refusal(path, 'question,answer\n"What is 1+1?",2\n"What is 1+3?,4\n'
                            '"What is 2+2?",4\n"What is 5+5?",10\n')  # fmt: skip
    assert message.startswith(
        f"data.path={path}: a double-quoted value opened in the row on line 3 runs on to line 4, "
        "where its closing quote has more text after it: most likely a quote on line 3 is never "
        "closed, and the lines between were read into that one value. In a CSV file "
    )
    assert message.endswith("Fix the file, or write the records as .jsonl.")
    message = refusal(path, 'question,answer\n1+1?,2\n"What is 1+3?,4\n2+2?,4\n')
    assert message.startswith(
        f"data.path={path}: the row that starts on line 3 opens a double-quoted value that is "
        "never closed: the file ends inside it. "
    )


def test_a_csv_row_with_a_value_after_its_closing_quote_is_refused(tmp_path):
    path = tmp_path / "q.csv"
    message = refusal(path, 'question,answer\n"What is" 1+1?,2\n')  # pandas: 'What is 1+1?'
    assert message.startswith(
        f"data.path={path}: line 2 has text after the closing quote of a double-quoted value. "
    )


@pytest.mark.parametrize(
    ("row", "said"),
    [
        # pandas: a trailing comma on every row shifts the columns (question=2, answer=null).
        ("What is 1+1?,2,", "line 2 has 3 values ('What is 1+1?', '2', '') where the header "
         "(line 1) has 2 columns (question, answer); most likely a comma inside a value that is "
         "not in double quotes splits it in two."),
        # pandas: answer null.
        ("What is 1+1?", "line 2 has 1 value ('What is 1+1?') where the header (line 1) has 2 "
         "columns (question, answer); most likely a value is missing"),
    ],
)  # fmt: skip
def test_a_csv_row_with_more_or_fewer_values_than_the_header_is_refused(tmp_path, row, said):
    path = tmp_path / "q.csv"
    assert refusal(path, f"question,answer\n{row}\n").startswith(f"data.path={path}: {said}")


def test_quoted_commas_quotes_and_line_breaks_in_csv_still_read_exactly(tmp_path):
    path = tmp_path / "q.csv"
    path.write_bytes(
        b'\xef\xbb\xbfquestion,answer\r\n"What is 1,000 + 1?",1001\r\n\r\n'
        b'"Say ""hi"",\r\nthen 2 + 2?",4\r\n   \r\nWhat is 3 + 3?,6\r\n'
    )
    assert records(path) == [
        ("What is 1,000 + 1?", "1001"),
        ('Say "hi",\r\nthen 2 + 2?', "4"),
        ("What is 3 + 3?", "6"),
    ]


def test_a_csv_with_only_its_header_holds_no_records(tmp_path):
    path = tmp_path / "q.csv"
    assert refusal(path, "question,answer\n") == (
        f"data.path={path} holds no records: the header (line 1: question, answer) has no rows "
        "under it."
    )


def test_a_value_longer_than_pythons_csv_limit_still_reads(tmp_path):
    path = tmp_path / "q.csv"
    path.write_text(f"question,answer\n{'x' * 200_000},2\n")
    assert records(path) == [("x" * 200_000, "2")]


# --- JSON ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "content", "said"),
    [
        # datasets read a null line as a record of nulls, a list of numbers as a column `text`.
        ("n.jsonl", GOOD + "null\n", "line 2 holds a JSON null, not a record (an object)."),
        ("s.jsonl", GOOD + '"What is 2 + 2?"\n', "line 2 holds a JSON string, not a record"),
        ("l.json", "[\n" + GOOD.strip() + ",\n 4\n]",
         "line 3 holds a JSON number inside a list, not a record"),
        ("n.json", "42\n", "line 1 holds a JSON number, not a record (an object)."),
        ("bad.jsonl", GOOD + '{"question": "2 + 2?", answer: "4"}\n',
         "line 2 is not valid JSON (Expecting property name enclosed in double quotes at column "
         "24)."),
    ],
)  # fmt: skip
def test_a_json_value_that_is_not_a_record_is_refused_naming_its_line(tmp_path, name, content,
                                                                      said):  # fmt: skip
    path = tmp_path / name
    message = refusal(path, content)
    assert message.startswith(f"data.path={path}: {said}"), message
    assert message.endswith("A .jsonl file holds one JSON object per record, a .json file a "
                            "list of them.")  # fmt: skip


def test_a_json_file_holding_an_empty_list_holds_no_records(tmp_path):
    path = tmp_path / "e.json"
    assert refusal(path, "[ ]\n") == (
        f"data.path={path} holds no records: the file holds only an empty list."
    )


def test_json_that_already_read_still_reads(tmp_path):
    # Several records on one line, a .json list over several lines, one object alone.
    rows = [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(3)]
    expected = [(r["question"], r["answer"]) for r in rows]
    (tmp_path / "a.jsonl").write_text(" ".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "b.json").write_text(json.dumps(rows, indent=2))
    (tmp_path / "c.json").write_text(json.dumps(rows[0]))
    assert records(tmp_path / "a.jsonl") == expected == records(tmp_path / "b.json")
    assert records(tmp_path / "c.json") == expected[:1]


# --- parquet and save_to_disk folders --------------------------------------------------------


@pytest.fixture
def saved(tmp_path) -> Path:
    folder = tmp_path / "saved"
    rows = [{"question": "What is 1 + 1?", "answer": "2"}]
    datasets.Dataset.from_list(rows).save_to_disk(str(folder))
    return folder


def test_a_saved_folder_missing_its_arrow_file_is_named(saved):
    (arrow,) = saved.glob("*.arrow")
    arrow.unlink()
    with pytest.raises(ConfigError) as err:
        records(saved)
    assert str(err.value).startswith(
        f"data.path={saved} could not be read as a saved dataset: its file {arrow.name} is "
        "missing. The folder is incomplete or damaged"
    )
    assert "save the dataset again with save_to_disk" in str(err.value)


def test_a_saved_folder_with_a_broken_dataset_info_is_named(saved):
    (saved / "dataset_info.json").write_text('{"features": ')
    with pytest.raises(ConfigError) as err:
        records(saved)
    assert str(err.value).startswith(
        f"data.path={saved} could not be read as a saved dataset: its dataset_info.json is not "
        "valid JSON (Expecting value at line 1, column 14). "
    )


def test_a_corrupt_parquet_file_shows_rlclis_paragraph_alone(tmp_path):
    # datasets adds its own console handler when first imported, which a job does only once
    # it reads a file: a fresh process, as a user's.
    path = tmp_path / "rows.parquet"
    path.write_bytes(b"PAR1" + b"\0" * 64 + b"PAR1")
    command = [sys.executable, "-m", "rlcli", "train", *TINY, "data=parquet",
               f"data.path={path}", f"hydra.run.dir={tmp_path / 'run'}"]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(
        f"rlcli: error: data.path={path} could not be read as parquet records: "
    )
    assert done.stderr.count("\n") == 1, done.stderr  # before: pyarrow's line came first
    assert "The file is cut short or is not parquet: write it again" in done.stderr
    assert not (tmp_path / "run").exists()


def test_a_handler_a_library_adds_during_a_job_stays_off_the_console(tmp_path, capsys):
    library = logging.getLogger("datasets.a_test_module")
    with job_log(tmp_path / "train.log"):
        logging.getLogger("datasets").addHandler(logging.StreamHandler(sys.stderr))
        library.error("Failed to read schema from 'x.parquet'")
    assert "Failed to read schema" not in capsys.readouterr().err
    assert "Failed to read schema from 'x.parquet'" in (tmp_path / "train.log").read_text()


# --- values Hydra's grammar takes only quoted ------------------------------------------------


@pytest.mark.parametrize(
    ("given", "handed_on"),
    [
        ("data.path=/tmp/dätä_路径/prøb.jsonl", "data.path='/tmp/dätä_路径/prøb.jsonl'"),
        ("hydra.run.dir=runs/rün", "hydra.run.dir='runs/rün'"),
        ("data.path=~/data/q #2.jsonl", "data.path='~/data/q #2.jsonl'"),
        ("data.path=/a/ä.jsonl,/b/b.jsonl", "data.path='/a/ä.jsonl',/b/b.jsonl"),  # a sweep
        ("x.names=[ä, b]", "x.names=['ä', b]"),
        ("data.path=/tmp/plain.jsonl", "data.path=/tmp/plain.jsonl"),
        ("data.path='/tmp/dätä.jsonl'", "data.path='/tmp/dätä.jsonl'"),  # quoted already
        ("x=${oc.env:HOME}/ä", "x=${oc.env:HOME}/ä"),  # left as written
        ("~x.y", "~x.y"),
    ],
)
def test_values_with_characters_hydra_takes_only_quoted_are_quoted(given, handed_on):
    assert quote_for_hydra(given) == handed_on
    if handed_on != given or "'" in given:
        check_syntax([given])  # Hydra reads it


def test_a_value_rlcli_cannot_quote_is_refused_saying_to_quote_it():
    with pytest.raises(ConfigError) as err:
        check_syntax(["data.path=${oc.env:HOME}/dätä.jsonl"])
    assert str(err.value).startswith(
        "'data.path=${oc.env:HOME}/dätä.jsonl' is not a valid override (LexerNoViableAlt"
    )
    assert "Hydra's grammar reads ä only inside quotes" in str(err.value)
    assert "quote it yourself, data.path='...'" in str(err.value)


def test_a_non_ascii_data_path_and_run_dir_are_used_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "dätä_路径" / "prøb.jsonl"
    data.parent.mkdir()
    data.write_text(GOOD + '{"question": "What is 2 + 2?", "answer": "4"}\n')
    code, err = rlcli(capsys, "data=jsonl", f"data.path={data}", "hydra.run.dir=runs/rün")
    assert code == 0, err
    run = tmp_path / "runs" / "rün"
    assert (run / "checkpoints" / "step_1").is_dir()
    assert f"data.path='{data}'" in (run / ".hydra" / "overrides.yaml").read_text()
    assert f"  path: {data}\n" in (run / "config.yaml").read_text()


def test_a_sweep_over_non_ascii_paths_reads_each_as_written(tmp_path, capsys):
    first, second = tmp_path / "ä.jsonl", tmp_path / "ö.jsonl"
    first.write_text(GOOD + "null\n")  # refused when read: the job got the path as written
    second.write_text(GOOD)
    sweep = f"hydra.sweep.dir={tmp_path / 'swëep'}"
    code, err = rlcli(capsys, "data=jsonl", f"data.path={first},{second}", "-m", sweep)
    assert code == 2
    assert err.splitlines()[-1].startswith(f"rlcli: error: data.path={first}: line 2 holds")
    assert not (tmp_path / "swëep").exists()  # the failed job's directory is gone too


def test_a_sweep_jobs_directory_is_named_without_the_quotes():
    task = ["data.path='/data/dätä/prøb.jsonl'", "algo=grpo"]
    assert job_dirname(0, task, ["algo"]) == "0_path=dätä-prøb.jsonl"


# --- nothing left behind ---------------------------------------------------------------------


def test_a_failed_validation_leaves_no_run_directory(tmp_path, capsys):
    run = tmp_path / "new" / "run"
    code, err = rlcli(capsys, "trainer.max_steps=ten", f"hydra.run.dir={run}")
    assert code == 2
    assert err == (
        "rlcli: error: Invalid config value at trainer.max_steps: Value 'ten' of type 'str' "
        "could not be converted to Integer\n"
    )
    assert list(tmp_path.iterdir()) == []  # neither run/ nor new/, which this command made


def test_a_failed_validation_in_the_default_run_directory_leaves_nothing(tmp_path, monkeypatch,
                                                                         capsys):  # fmt: skip
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()  # as earlier runs left it: kept
    code, _ = rlcli(capsys, "trainer.max_steps=ten")
    assert code == 2 and list(tmp_path.iterdir()) == [tmp_path / "runs"]
    assert list((tmp_path / "runs").iterdir()) == []


def test_a_data_file_refused_after_the_run_directory_is_held_leaves_nothing(tmp_path, capsys):
    # By then the job wrote its lock file and config.yaml too.
    path = tmp_path / "q.csv"
    path.write_text('question,answer\n"What is 1+3?,4\n')
    code, err = rlcli(capsys, "data=jsonl", f"data.path={path}", f"hydra.run.dir={tmp_path}/r")
    assert code == 2 and err.startswith(f"rlcli: error: data.path={path}: the row that starts")
    assert sorted(tmp_path.iterdir()) == [path]


def test_a_failed_validation_in_an_existing_run_directory_leaves_everything(tmp_path, capsys):
    run = tmp_path / "rün"  # an earlier run's, with a checkpoint
    step = run / "checkpoints" / "step_1"
    step.mkdir(parents=True)
    (step / "model.safetensors").write_bytes(b"weights")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (run / ".rlcli-run").write_text("{}")
    code, _ = rlcli(capsys, "trainer.max_steps=ten", "hydra.run.dir=" + str(run))
    assert code == 2
    assert (step / "model.safetensors").read_bytes() == b"weights"
    assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n'
    # The directory was used as written: Hydra wrote this command's overrides there.
    assert "trainer.max_steps=ten" in (run / ".hydra" / "overrides.yaml").read_text()


def test_a_failed_validation_in_an_empty_directory_made_before_keeps_it(tmp_path, capsys):
    (tmp_path / "mine").mkdir()
    code, _ = rlcli(capsys, "trainer.max_steps=ten", f"hydra.run.dir={tmp_path / 'mine'}")
    assert code == 2 and (tmp_path / "mine").is_dir()


def test_under_torchrun_only_rank_0_removes_the_run_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RANK", "1")
    code, _ = rlcli(capsys, "trainer.max_steps=ten", f"hydra.run.dir={tmp_path / 'run'}")
    assert code == 2 and (tmp_path / "run" / ".hydra").is_dir()


def start_files(run: Path) -> None:
    """What a start that failed validation leaves: Hydra's files and the job log."""
    (run / ".hydra").mkdir(parents=True)
    for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
        (run / ".hydra" / name).write_text("{}\n")
    (run / "train.log").write_text("rlcli: error: ...\n")


def test_a_directory_made_here_that_holds_anything_else_is_kept(tmp_path):
    run = tmp_path / "made" / "run"
    run_dirs.forget_new_dirs()
    run_dirs.note_new_dirs(run)
    start_files(run)
    (run / "notes.txt").write_text("a user's file")
    assert not run_dirs.discard_unused(run, (".hydra", "train.log"))
    assert (run / "notes.txt").read_text() == "a user's file"
    (run / "notes.txt").unlink()
    assert run_dirs.discard_unused(run, (".hydra", "train.log"))
    assert list(tmp_path.iterdir()) == []


def test_a_directory_another_run_holds_is_kept(tmp_path):
    import fcntl

    run = tmp_path / "run"
    run_dirs.forget_new_dirs()
    run_dirs.note_new_dirs(run)
    start_files(run)
    fd = os.open(run / ".rlcli-run", os.O_RDWR | os.O_CREAT)  # another run's lock
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert not run_dirs.discard_unused(run, (".hydra", "train.log"))
    finally:
        os.close(fd)
    assert (run / ".hydra" / "config.yaml").is_file()
