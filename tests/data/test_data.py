"""Data adapters on generated problems and on fixture files in each dataset's schema.

The fixtures in tests/fixtures/ are hand-written records in the hub datasets' own schemas
(see tests/fixtures/README.md); the hub itself cannot be reached from the tests.
"""

import json
import random
import re
import time
from dataclasses import fields, replace
from fractions import Fraction
from itertools import permutations
from pathlib import Path

import datasets
import huggingface_hub.constants
import pytest
import yaml

from rlcli.config import CONF_DIR, ConfigError, DataConfig
from rlcli.data import DATASETS, load_splits
from rlcli.data.answers import ANSWER_FORMATS, boxed_answer, gsm8k_answer
from rlcli.data.countdown import MAX_EXPRESSION_CHARS, countdown_problem, countdown_score
from rlcli.data.files import read_texts
from rlcli.data.generated import arith_splits
from rlcli.data.problems import PromptStream, render_prompt, write_records
from rlcli.runtime.models import load_tokenizer, smollm2_dir
from rlcli.validate import section
from tests.conftest import FIXTURES

GSM8K_ANSWERS = {"38", "210", "500", "1350", "9", "72"}


def data_cfg(name: str, **overrides) -> DataConfig:
    """The config `data=<name>` selects (its conf/data yaml over data_base.yaml), with overrides."""
    return section("data", name, **overrides)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# --- the registry and its yaml files ---------------------------------------------------------


def test_every_adapter_has_a_yaml_named_after_it_with_known_fields_only():
    assert sorted(DATASETS) == [
        "arith",
        "countdown",
        "dapo_math_17k",
        "gsm8k",
        "jsonl",
        "math",
        "pairs",
        "parquet",
    ]
    assert sorted(ANSWER_FORMATS) == ["boxed", "gsm8k", "plain"]
    known = {f.name for f in fields(DataConfig)}
    yamls = sorted((CONF_DIR / "data").glob("*.yaml"))
    assert sorted(y.stem for y in yamls) == sorted(DATASETS)
    for path in yamls:
        text = path.read_text()
        values = yaml.safe_load(text)
        assert text.startswith("# "), f"{path.name} must open with what the dataset is"
        assert values["name"] == path.stem
        assert values.pop("defaults") == ["/data_base@_here_", "_self_"], path.name
        assert set(values) <= known, f"{path.name}: {set(values) - known} not in DataConfig"
        if values.get("answer_format"):
            assert values["answer_format"] in ANSWER_FORMATS


def test_load_splits_rejects_an_unknown_name():
    with pytest.raises(ConfigError, match="data.name='nope'.*arith, countdown"):
        load_splits(replace(data_cfg("arith"), name="nope"))


# --- arith -----------------------------------------------------------------------------------


def test_arith_is_seeded_correct_and_splits_do_not_overlap():
    cfg = data_cfg(
        "arith", instruction="", difficulty=2, operators="+-*", num_operands=3, num_train=300,
        num_test=50,
    )  # fmt: skip
    train, test = arith_splits(cfg)
    assert (train, test) == arith_splits(cfg)  # same seed, same problems
    assert len(train) == 300 and len(test) == 50
    assert not {p.question for p in train} & {p.question for p in test}
    for p in train[:50]:
        expr = p.question.removeprefix("What is ").split("?")[0].replace("×", "*")
        # The generator computes answers without eval(); the test checks it against Python.
        assert int(p.answer) == eval(expr)  # noqa: S307 - trusted, generated digits and operators
    other, _ = arith_splits(data_cfg("arith", instruction="", seed=7, num_train=300, num_test=50))
    assert [p.question for p in other] != [p.question for p in train]


def test_arith_records_hold_the_full_prompt_and_ids_are_kept():
    train, test = load_splits(data_cfg("arith", num_train=5, num_test=2))
    assert [p.id for p in train] == [f"arith-train-{i}" for i in range(5)]
    assert [p.id for p in test] == ["arith-test-0", "arith-test-1"]
    for p in train + test:
        assert p.question.endswith("? Give the final answer as a number.")
        assert p.record == {"question": p.question, "answer": p.answer}


def test_arith_difficulty_sets_operand_digits():
    train, _ = arith_splits(
        data_cfg("arith", instruction="", difficulty=3, operators="+", num_train=20, num_test=0)
    )
    for p in train:
        a, b = p.question.removeprefix("What is ").split("?")[0].split(" + ")
        assert len(a) == 3 and len(b) == 3


def test_arith_rejects_unknown_operators():
    with pytest.raises(ConfigError, match="data.operators='/'"):
        arith_splits(data_cfg("arith", instruction="", operators="/"))


# --- countdown: generation -------------------------------------------------------------------


def reachable(numbers: list[int], target: int) -> bool:
    """Exhaustive search, independent of the generator: combine any two values with + - * /
    (exact fractions) until one is left."""

    def search(values: list[Fraction]) -> bool:
        if len(values) == 1:
            return values[0] == target
        for i, j in permutations(range(len(values)), 2):
            rest = [v for k, v in enumerate(values) if k not in (i, j)]
            a, b = values[i], values[j]
            results = [a + b, a - b, a * b] + ([a / b] if b else [])
            if any(search([*rest, r]) for r in results):
                return True
        return False

    return search([Fraction(n) for n in numbers])


def test_countdown_is_seeded_disjoint_and_every_target_is_reachable():
    cfg = data_cfg("countdown", num_train=60, num_test=20)
    train, test = load_splits(cfg)
    assert (train, test) == load_splits(cfg)
    assert len(train) == 60 and len(test) == 20
    assert [p.id for p in test[:2]] == ["countdown-test-0", "countdown-test-1"]

    def key(p):
        return tuple(sorted(p.record["numbers"])), p.record["target"]

    assert not {key(p) for p in train} & {key(p) for p in test}
    for p in train + test:
        numbers, target = p.record["numbers"], p.record["target"]
        assert set(p.record) == {"question", "answer", "numbers", "target"}
        assert p.question == p.record["question"] and p.answer == str(target)
        assert len(numbers) == 3 and all(10 <= n <= 99 for n in numbers)
        assert isinstance(target, int) and target >= 1
        assert str(numbers) in p.question and f"equals {target}" in p.question
        assert "<answer>" in p.question
        assert reachable(numbers, target)
    other, _ = load_splits(data_cfg("countdown", num_train=60, num_test=20, seed=5))
    assert [p.question for p in other] != [p.question for p in train]


def test_countdown_hidden_solutions_pass_the_checker():
    rng = random.Random(0)
    problems = [countdown_problem(rng, 2, "+-*/", 4) for _ in range(300)]
    problems = [p for p in problems if p is not None]
    assert len(problems) > 100
    assert any("/" in p.solution for p in problems)
    for p in problems:
        assert countdown_score(f"<answer>{p.solution}</answer>", p.numbers, p.target) == 1.0


def test_countdown_uses_only_the_configured_operators():
    train, _ = load_splits(data_cfg("countdown", operators="+", num_train=30, num_test=0))
    assert all(p.record["target"] == sum(p.record["numbers"]) for p in train)
    assert all("operations +" in p.question for p in train)
    with pytest.raises(ConfigError, match=r"data.operators='\^'"):
        load_splits(data_cfg("countdown", operators="^"))


# --- countdown: the checker ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "numbers", "target", "score"),
    [
        ("<think>3 times 7 is 21.</think> <answer>3 * 7 + 5</answer>", [3, 5, 7], 26, 1.0),
        ("<answer>(5 + 7) * 3 = 36</answer>", [3, 5, 7], 36, 1.0),  # a trailing "= value"
        ("<answer>3 × 7 + 5</answer>", [3, 5, 7], 26, 1.0),  # the multiplication sign
        ("<answer>4 / (2 / 3)</answer>", [2, 3, 4], 6, 1.0),  # exact fractions
        ("<answer>-2 + 10</answer>", [2, 10], 8, 1.0),
        ("<answer>" + "(" * 90 + "3 * 7 + 5" + ")" * 90 + "</answer>", [3, 5, 7], 26, 1.0),
        ("I would say\n3 * 7 + 5\n", [3, 5, 7], 26, 1.0),  # no tags: the last line
        ("<answer>1 + 1</answer> no, <answer>3 * 7 + 5</answer>", [3, 5, 7], 26, 1.0),
        ("<answer>3 * 7 + 5</answer> no, <answer>1 + 1</answer>", [3, 5, 7], 26, 0.0),
        ("<answer>3 * 7 - 5</answer>", [3, 5, 7], 26, 0.0),  # wrong value
        ("<answer>3 * 7 + 5 + 5 - 5</answer>", [3, 5, 7], 26, 0.0),  # 5 used three times
        ("<answer>21 + 5</answer>", [3, 5, 7], 26, 0.0),  # 3 and 7 missing
        ("<answer>5 + 7</answer>", [3, 5, 7], 12, 0.0),  # 3 missing
        ("<answer>3 * 7 + 5 * 1</answer>", [3, 5, 7], 26, 0.0),  # 1 is not given
        ("<answer>3 * (7 + 5</answer>", [3, 5, 7], 36, 0.0),  # malformed
        ("<answer>3.0 * 7 + 5</answer>", [3, 5, 7], 26, 0.0),  # floats are not the numbers
        ("<answer>3 + 5 / (5 - 5)</answer>", [3, 5, 5], 3, 0.0),  # division by zero
        ("<answer></answer>", [3, 5, 7], 26, 0.0),
        ("", [3, 5, 7], 26, 0.0),
    ],
)
def test_countdown_score_on_hand_written_responses(response, numbers, target, score):
    assert countdown_score(response, numbers, target) == score


@pytest.mark.parametrize(
    "payload",
    [
        "__import__('os').system('x')",
        "(1).__class__",
        "9**9**9",
        "open('f')",
        "(lambda: 3)()",
        "'3' * 7",
        "[3][0] + 5 + 7",
        "3 if 5 else 7",
        "(x := 3) + 5 + 7",
        "True + 5 + 7",
        "1+" * 5000 + "1",  # 10,001 characters
        "(" * 150 + "3" + ")" * 150,
        "9" * 5000,
    ],
)
def test_countdown_score_rejects_unsafe_input_quickly(payload):
    start = time.perf_counter()
    assert countdown_score(f"<answer>{payload}</answer>", [3, 5, 7], 26) == 0.0
    assert countdown_score(payload, [3, 5, 7], 26) == 0.0  # as the last line, too
    assert time.perf_counter() - start < 1.0


def test_countdown_score_runs_nothing(tmp_path):
    marker = tmp_path / "executed"
    payloads = [
        f"open({str(marker)!r}, 'w').close()",
        f"__import__('pathlib').Path({str(marker)!r}).touch()",
        f"__import__('os').system('touch {marker}')",
        f"exec(\"open({str(marker)!r}, 'w')\")",
    ]
    for payload in payloads:
        assert countdown_score(f"<answer>{payload}</answer>", [3, 5, 7], 26) == 0.0
        assert not marker.exists(), payload
    # The payloads are live: run by Python, the first one does create the file.
    exec(payloads[0])  # noqa: S102 - proves the test above could fail
    assert marker.exists()


def test_expression_length_limit_is_what_rejects_long_input():
    numbers = [1] * 80  # "1 + 1 + ... + 1" is 317 characters, over the limit
    expr = " + ".join(map(str, numbers))
    assert len(expr) > MAX_EXPRESSION_CHARS
    assert countdown_score(f"<answer>{expr}</answer>", numbers, 80) == 0.0
    shorter = " + ".join(["1"] * 40)
    assert countdown_score(f"<answer>{shorter}</answer>", [1] * 40, 40) == 1.0


# --- answer formats --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("so $x = \\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}"),
        ("first \\boxed{4}, then \\boxed{6}", "6"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("the remainder is $\\boxed 5$.", "5"),
        ("\\fbox{7}", "7"),
        ("\\boxed{\\frac{1}{2}", None),  # unbalanced
        ("no box here", None),
        ("\\boxed{}", None),
    ],
)
def test_boxed_answer(text, answer):
    assert boxed_answer(text) == answer


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("3 + 4 = <<3+4=7>>7\n#### 7", "7"),
        ("#### 1,250", "1250"),
        ("a #### b\n#### 12 ", "12"),
        ("The answer is 7.", None),
    ],
)
def test_gsm8k_answer(text, answer):
    assert gsm8k_answer(text) == answer


# --- record adapters on fixtures -------------------------------------------------------------


def test_gsm8k_fixture_answers_records_and_held_out_split():
    cfg = data_cfg("gsm8k", path=str(FIXTURES / "gsm8k.jsonl"), num_test=2)
    train, test = load_splits(cfg)
    assert (train, test) == load_splits(cfg)  # the seeded hold-out is stable
    assert len(train) == 4 and len(test) == 2
    assert {p.answer for p in train + test} == GSM8K_ANSWERS
    assert not {p.id for p in train} & {p.id for p in test}
    by_id = {p.id: p for p in train + test}
    first = by_id["gsm8k-train-0"]
    assert first.answer == "38"
    assert first.record["question"].startswith("A baker fills 12 trays")
    assert first.record["answer"].endswith("#### 38")  # the record is kept as it was
    assert first.question == first.record["question"] + " Give the final answer in \\boxed{}."


def test_test_path_gives_the_test_split(tmp_path):
    rows = [{"question": "What is 2 + 2?", "answer": "It is 4.\n#### 4"}]
    test_file = write_jsonl(tmp_path / "test.jsonl", rows)
    cfg = data_cfg("gsm8k", path=str(FIXTURES / "gsm8k.jsonl"), test_path=str(test_file))
    train, test = load_splits(cfg)
    assert len(train) == 6  # nothing held out
    assert [(p.id, p.answer) for p in test] == [("gsm8k-test-0", "4")]


def test_math_fixture_takes_the_last_boxed_answer():
    train, test = load_splits(data_cfg("math", path=str(FIXTURES / "math.jsonl"), num_test=0))
    assert test == []
    answers = {p.record["problem"]: p.answer for p in train}
    assert answers == {
        "What is $\\frac{3}{4} - \\frac{1}{4}$?": "\\frac{1}{2}",
        "Solve for $x$: $2x + 7 = 19$.": "6",
        "Find the point where the lines $y = x + 1$ and $y = 3 - x$ meet.": "(1, 2)",
        "How many positive divisors does $12$ have?": "6",
        "What is the remainder when $29$ is divided by $8$?": "5",
        "Simplify $\\sqrt{50}$.": "5\\sqrt{2}",
    }
    assert {p.record["type"] for p in train} == {"Prealgebra", "Algebra", "Number Theory"}


def test_template_formats_the_record_fields():
    template = "{problem}\n\n({type}, {level}) Put the final answer in \\boxed{{}}."
    cfg = data_cfg("math", path=str(FIXTURES / "math.jsonl"), num_test=0, template=template)
    cfg.instruction = ""
    train, _ = load_splits(cfg)
    assert train[1].question == (
        "Solve for $x$: $2x + 7 = 19$.\n\n(Algebra, Level 1) Put the final answer in \\boxed{}."
    )


def test_dapo_fixture_dedupes_chat_prompts_and_reads_dotted_answers():
    path = str(FIXTURES / "dapo_math_17k.parquet")
    train, test = load_splits(data_cfg("dapo_math_17k", path=path, num_test=1))
    problems = train + test
    assert len(train) == 4 and len(test) == 1  # 6 rows, one a repeat
    assert sorted(p.answer for p in problems) == sorted(["9", "38", "29", "64", "7"])
    assert "dapo_math_17k-train-3" not in {p.id for p in problems}  # the repeated row
    for p in problems:
        assert p.question == p.record["prompt"][-1]["content"]  # the user message, unchanged
        assert p.question.startswith("Solve the following math problem step by step.")
        assert p.record["reward_model"] == {
            "ground_truth": p.answer,
            "style": "rule-lighteval/MATH_v2",
        }
        assert set(p.record) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    every_row, _ = load_splits(data_cfg("dapo_math_17k", path=path, num_test=0, dedupe=False))
    assert len(every_row) == 6


def test_dedupe_happens_before_the_hold_out(tmp_path):
    rows = [{"question": f"q{i % 3}", "answer": str(i % 3)} for i in range(30)]
    path = write_jsonl(tmp_path / "repeats.jsonl", rows)
    train, test = load_splits(data_cfg("jsonl", path=str(path), num_test=1, dedupe=True))
    assert len(train) == 2 and len(test) == 1
    assert not {p.question for p in train} & {p.question for p in test}


def test_chat_prompts_use_the_last_user_message_and_dotted_paths_index_lists(tmp_path):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "an answer"},
        {"role": "user", "content": "second question"},
    ]
    path = write_jsonl(tmp_path / "chat.jsonl", [{"messages": messages, "sol": {"value": 3}}])
    cfg = data_cfg("jsonl", path=str(path), prompt_field="messages", answer_field="sol.value")
    (problem,), _ = load_splits(cfg)
    assert (problem.question, problem.answer) == ("second question", "3")
    cfg.prompt_field = "messages.1.content"
    (problem,), _ = load_splits(cfg)
    assert problem.question == "first question"
    no_user = write_jsonl(tmp_path / "no_user.jsonl", [{"messages": messages[:1], "sol": "3"}])
    with pytest.raises(ConfigError, match="data.prompt_field=messages is a list with no user"):
        load_splits(data_cfg("jsonl", path=str(no_user), prompt_field="messages"))


def test_limit_keeps_a_seeded_subset_of_the_training_problems():
    cfg = data_cfg("gsm8k", path=str(FIXTURES / "gsm8k.jsonl"), num_test=0, limit=3)
    train, _ = load_splits(cfg)
    assert len(train) == 3 and train == load_splits(cfg)[0]
    every, _ = load_splits(data_cfg("gsm8k", path=str(FIXTURES / "gsm8k.jsonl"), num_test=0))
    assert set(train) < set(every)
    cfg.limit = 0
    with pytest.raises(ConfigError, match="data.limit=0"):
        load_splits(cfg)


def test_jsonl_fields_and_split(tmp_path):
    rows = [{"q": f"What is {i} + 1?", "a": str(i + 1), "other": i} for i in range(10)]
    path = write_jsonl(tmp_path / "probs.jsonl", rows)
    cfg = data_cfg("jsonl", path=str(path), prompt_field="q", answer_field="a", num_test=3)
    train, test = load_splits(cfg)
    assert len(train) == 7 and len(test) == 3
    assert {p.answer for p in train + test} == {str(i + 1) for i in range(10)}
    assert {p.record["other"] for p in train + test} == set(range(10))


def test_parquet_and_json_files_read_like_jsonl(tmp_path):
    rows = [{"question": f"What is {i} + {i}?", "answer": 2 * i} for i in range(4)]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "rows.parquet"))
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    for name, file in [("parquet", "rows.parquet"), ("jsonl", "rows.json")]:
        train, _ = load_splits(data_cfg(name, path=str(tmp_path / file)))
        assert [(p.question, p.answer) for p in train] == [
            (r["question"], str(r["answer"])) for r in rows
        ]


# --- errors a user can fix -------------------------------------------------------------------


def test_file_errors_name_the_path(tmp_path):
    missing = tmp_path / "missing.jsonl"
    with pytest.raises(ConfigError, match=f"data.path={missing}: no such file"):
        load_splits(data_cfg("jsonl", path=str(missing)))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match=f"data.path={empty} holds no records"):
        load_splits(data_cfg("jsonl", path=str(empty)))
    sheet = tmp_path / "rows.xlsx"
    sheet.write_text("question,answer\n1+1,2\n")
    with pytest.raises(
        ConfigError, match=r"suffix '\.xlsx'.*\.jsonl.*\.parquet or \.csv.*save_to_disk"
    ):
        load_splits(data_cfg("jsonl", path=str(sheet)))
    garbage = tmp_path / "garbage.parquet"
    garbage.write_text("not parquet")
    with pytest.raises(ConfigError, match=f"data.path={garbage} could not be read as parquet"):
        load_splits(data_cfg("parquet", path=str(garbage)))
    with pytest.raises(ConfigError, match=f"data.test_path={missing}: no such file"):
        load_splits(data_cfg("gsm8k", path=str(FIXTURES / "gsm8k.jsonl"), test_path=str(missing)))


GOOD = b'{"question": "What is 1 + 1?", "answer": "2"}\n'


BAD_RECORDS = {
    # A bad byte in a key (datasets fails) and in a value (datasets loads it, then fails when
    # the rows are read): both are found before datasets reads the file.
    "key.jsonl": (
        GOOD * 2 + b'{"q\xffuestion": "x", "answer": "4"}\n',
        "line 3 is not UTF-8 text (byte 0xff at column 4)",
    ),
    "value.jsonl": (
        GOOD + b'{"question": "caf\xe9", "answer": "4"}\n',
        "line 2 is not UTF-8 text (byte 0xe9 at column 18)",
    ),
    "comma.jsonl": (
        GOOD * 2 + b'{"question": "3 + 3?" "answer": "6"}\n',
        "line 3 is not valid JSON (Expecting ',' delimiter at column 23)",
    ),
    "cut.jsonl": (
        GOOD + b'{"question": "3 + 3?", "ans\n',
        "line 2 is not valid JSON (Invalid control character at column 28)",
    ),
    "list.jsonl": (GOOD + b'["3 + 3?", "6"]\n', "line 2 holds a JSON string inside a list, not a"),
    "trailing.json": (
        b'[{"question": "1 + 1?", "answer": "2"},\n {"question": "2", "answer": "2"},\n]\n',
        "line 3 is not valid JSON (Expecting value at column 1)",
    ),
}


@pytest.mark.parametrize("name", list(BAD_RECORDS))
def test_a_file_that_is_not_utf8_or_not_json_names_the_line(tmp_path, name):
    content, expected = BAD_RECORDS[name]
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ConfigError) as err:
        load_splits(data_cfg("jsonl", path=str(path), num_test=0))
    assert str(err.value).startswith(f"data.path={path}: {expected}"), str(err.value)


def test_json_records_over_several_lines_with_a_bom_or_crlf_still_read(tmp_path):
    rows = [{"question": "What is 1 + 1?", "answer": "2"}, {"question": "2 + 2?", "answer": "4"}]
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b"\r\n".join(json.dumps(r, indent=1).encode() for r in rows))
    train, _ = load_splits(data_cfg("jsonl", path=str(path), num_test=0))
    assert [(p.question, p.answer) for p in train] == [(r["question"], r["answer"]) for r in rows]


def test_a_directory_where_a_file_belongs_is_named(tmp_path):
    gsm8k = str(FIXTURES / "gsm8k.jsonl")
    for key, cfg in [
        ("data.path", data_cfg("jsonl", path=str(tmp_path))),
        ("data.test_path", data_cfg("gsm8k", path=gsm8k, test_path=str(tmp_path))),
        ("data.path", data_cfg("pairs", path=str(tmp_path))),  # DPO's pairs
    ]:
        with pytest.raises(
            ConfigError, match=re.escape(f"{key}={tmp_path} is a directory, not a file")
        ):
            load_splits(cfg)
    with pytest.raises(ConfigError, match=re.escape(f"algo.ptx_path={tmp_path} is a directory")):
        read_texts(str(tmp_path))


def test_a_relative_data_path_that_is_missing_says_where_it_was_looked_for(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    where = tmp_path / "data" / "train.jsonl"
    expected = f"data.path=data/train.jsonl: no such file (looked for at {where})"
    with pytest.raises(ConfigError, match=re.escape(expected)):
        load_splits(data_cfg("jsonl", path="data/train.jsonl"))


PTX_ERRORS = {
    "missing.txt": (None, ": no such file"),
    "latin1.txt": (
        b"first\nsecond t\xe9xt\n",
        ": line 2 is not UTF-8 text (byte 0xe9 at column 9)",
    ),
    "bad.jsonl": (
        b'{"text": "a"}\n\n{"text": "b",}\n',
        ": line 3 is not a JSON object with a 'text'",
    ),
    "no_text.jsonl": (b'{"text": "a"}\n{"content": "b"}\n', ": line 2 is not a JSON object"),
    "blank.txt": (b"\n \n", " holds no text."),
}


@pytest.mark.parametrize("name", list(PTX_ERRORS))
def test_ptx_text_errors_name_the_file_and_line(tmp_path, name):
    content, expected = PTX_ERRORS[name]
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError, match=re.escape(f"algo.ptx_path={path}{expected}")):
        read_texts(str(path))


def test_ptx_text_reads_lines_and_jsonl_text_fields(tmp_path):
    (tmp_path / "t.txt").write_bytes("one\r\n\ntwo \u00e9\n".encode())
    (tmp_path / "t.jsonl").write_text('{"text": "one"}\n\n{"text": "two", "id": 2}\n')
    assert read_texts(str(tmp_path / "t.txt")) == ["one", "two \u00e9"]
    assert read_texts(str(tmp_path / "t.jsonl")) == ["one", "two"]


def test_a_missing_field_names_the_row_and_the_fields_present(tmp_path):
    rows = [{"question": "What is 1 + 1?", "answer": "2"}, {"question": "What is 2 + 2?"}]
    path = write_jsonl(tmp_path / "probs.jsonl", rows)
    with pytest.raises(
        # A row without a field other rows have is read as null (columnar files fill it so).
        ConfigError,
        match=r"'answer' \(data.answer_field\) is null in row 1 of .* \(fields present: question\)",
    ):
        load_splits(data_cfg("jsonl", path=str(path)))
    with pytest.raises(
        ConfigError, match=r"no field 'problem' in row 0 .* \(fields present: question, answer\)"
    ):
        load_splits(data_cfg("math", path=str(FIXTURES / "gsm8k.jsonl")))
    nested = str(FIXTURES / "dapo_math_17k.parquet")
    with pytest.raises(
        ConfigError,
        match=r"'reward_model\.truth' .*reward_model\.ground_truth, reward_model\.style",
    ):
        load_splits(data_cfg("dapo_math_17k", path=nested, answer_field="reward_model.truth"))


def test_template_naming_a_missing_field_lists_the_fields_present():
    cfg = data_cfg("math", path=str(FIXTURES / "math.jsonl"), template="{question}?")
    with pytest.raises(
        ConfigError, match=r"'question'.*fields present: problem, level, type, solution"
    ):
        load_splits(cfg)


def test_an_answer_not_in_the_configured_format_is_named():
    cfg = data_cfg("gsm8k", path=str(FIXTURES / "math.jsonl"), prompt_field="problem")
    cfg.answer_field = "solution"
    with pytest.raises(ConfigError, match="data.answer_format=gsm8k finds no answer in row 0"):
        load_splits(cfg)
    cfg.answer_format = "latex"
    with pytest.raises(ConfigError, match="data.answer_format='latex'.*boxed, gsm8k, plain"):
        load_splits(cfg)


def test_records_need_a_source_and_room_for_training():
    with pytest.raises(ConfigError, match="data=parquet needs data.path"):
        load_splits(data_cfg("parquet"))
    cfg = data_cfg("gsm8k", path=str(FIXTURES / "gsm8k.jsonl"))  # num_test=200 of 6 records
    with pytest.raises(ConfigError, match="data.num_test=200 would hold out all 6 records"):
        load_splits(cfg)


def test_a_hub_dataset_that_cannot_load_says_how_to_use_a_local_copy(monkeypatch):
    # Offline mode makes `datasets` fail at once instead of retrying the network.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    cfg = data_cfg("gsm8k", hub_id="rlcli-tests/no-such-dataset")
    with pytest.raises(ConfigError, match=r"data.hub_id=rlcli-tests/no-such-dataset .*data\.path"):
        load_splits(cfg)


# --- writing records back --------------------------------------------------------------------


def test_write_records_round_trips_gsm8k(tmp_path):
    cfg = data_cfg("gsm8k", path=str(FIXTURES / "gsm8k.jsonl"), num_test=0)
    problems, _ = load_splits(cfg)
    out = tmp_path / "filtered" / "gsm8k.jsonl"
    write_records(problems[:4], out)
    write_records(problems, out)  # replaces the earlier file
    assert [p.name for p in out.parent.iterdir()] == ["gsm8k.jsonl"]  # no temporary file left
    again, _ = load_splits(data_cfg("gsm8k", path=str(out), num_test=0))
    assert [(p.question, p.answer, p.record) for p in again] == [
        (p.question, p.answer, p.record) for p in problems
    ]
    with pytest.raises(ConfigError, match="ending in .jsonl"):
        write_records(problems, tmp_path / "out.parquet")


@pytest.mark.parametrize("generated", ["arith", "countdown"])
def test_write_records_of_generated_problems_load_with_data_jsonl(tmp_path, generated):
    problems, _ = load_splits(data_cfg(generated, num_train=8, num_test=0))
    out = tmp_path / f"{generated}.jsonl"
    write_records(problems, out)
    again, _ = load_splits(data_cfg("jsonl", path=str(out)))
    assert [(p.question, p.answer, p.record) for p in again] == [
        (p.question, p.answer, p.record) for p in problems
    ]
    if generated == "countdown":  # numbers and target come back as ints, still solvable
        assert all(reachable(p.record["numbers"], p.record["target"]) for p in again)


# --- feeding the trainer ---------------------------------------------------------------------


def test_prompt_stream_is_a_seeded_permutation_per_epoch():
    problems, _ = arith_splits(data_cfg("arith", instruction="", num_train=10, num_test=0))
    stream = PromptStream(problems, seed=3)
    first_epoch = stream.take(10)
    assert sorted(p.id for p in first_epoch) == sorted(p.id for p in problems)
    assert stream.take(10) != first_epoch  # a new shuffle each epoch
    resumed = PromptStream(problems, seed=3, position=10)
    assert resumed.take(4) == PromptStream(problems, seed=3).take(14)[10:]


def test_render_prompt_uses_the_chat_template():
    tokenizer = load_tokenizer(str(smollm2_dir()))
    text = render_prompt(tokenizer, "What is 1 + 2?", system_prompt="Be brief.")
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert text.endswith("<|im_start|>assistant\n")
