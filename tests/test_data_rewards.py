"""Data adapters and rewards on hand-written inputs."""

import json

import pytest

from rlcli.config import ConfigError, DataConfig
from rlcli.data import PromptStream, arith_splits, jsonl_splits, render_prompt
from rlcli.models import load_tokenizer, smollm2_dir
from rlcli.rewards import math_correct, space_rate


def test_arith_is_seeded_correct_and_splits_do_not_overlap():
    cfg = DataConfig(difficulty=2, operators="+-*", num_operands=3, num_train=300, num_test=50)
    train, test = arith_splits(cfg)
    assert (train, test) == arith_splits(cfg)  # same seed, same problems
    assert len(train) == 300 and len(test) == 50
    assert not {p.question for p in train} & {p.question for p in test}
    for p in train[:50]:
        expr = p.question.removeprefix("What is ").split("?")[0].replace("×", "*")
        # The generator computes answers without eval(); the test checks it against Python.
        assert int(p.answer) == eval(expr)  # noqa: S307 - trusted, generated digits and operators
    other, _ = arith_splits(DataConfig(seed=7, num_train=300, num_test=50))
    assert [p.question for p in other] != [p.question for p in train]


def test_arith_difficulty_sets_operand_digits():
    train, _ = arith_splits(DataConfig(difficulty=3, operators="+", num_train=20, num_test=0))
    for p in train:
        a, b = p.question.removeprefix("What is ").split("?")[0].split(" + ")
        assert len(a) == 3 and len(b) == 3


def test_arith_rejects_unknown_operators():
    with pytest.raises(ConfigError, match="data.operators='/'"):
        arith_splits(DataConfig(operators="/"))


def test_jsonl_fields_and_split(tmp_path):
    path = tmp_path / "probs.jsonl"
    rows = [{"q": f"What is {i} + 1?", "a": str(i + 1), "other": i} for i in range(10)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = DataConfig(name="jsonl", path=str(path), prompt_field="q", answer_field="a", num_test=3)
    train, test = jsonl_splits(cfg)
    assert len(train) == 7 and len(test) == 3
    assert {p.answer for p in train + test} == {str(i + 1) for i in range(10)}
    with pytest.raises(ConfigError, match="no field 'question'"):
        jsonl_splits(DataConfig(name="jsonl", path=str(path)))
    with pytest.raises(ConfigError, match="no such file"):
        jsonl_splits(DataConfig(name="jsonl", path=str(tmp_path / "missing.jsonl")))


def test_prompt_stream_is_a_seeded_permutation_per_epoch():
    problems, _ = arith_splits(DataConfig(num_train=10, num_test=0))
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


@pytest.mark.parametrize(
    ("response", "answer", "score"),
    [
        ("12 + 35 = 47", "47", 1.0),
        ("The answer is \\boxed{47}.", "47", 1.0),
        ("Answer: 47.0", "47", 1.0),
        ("12 + 35 = 56", "47", 0.0),
        ("47 is wrong, it is 48", "47", 0.0),
        ("", "47", 0.0),
        ("no number here", "47", 0.0),
        ("x = 1/2", "0.5", 1.0),
    ],
)
def test_math_reward_checks_equivalence_not_strings(response, answer, score):
    assert math_correct([response], [answer]) == [score]


def test_space_rate():
    assert space_rate(["a b", "abcd", ""], ["", "", ""]) == [pytest.approx(1 / 3), 0.0, 0.0]
