"""Rewards on hand-written responses, including malformed ones; weighted mixes with each
component logged; failures and time-outs isolated to the sample that caused them."""

import math
import time
from pathlib import Path

import pytest
import torch

from rlcli.config import ConfigError
from rlcli.config.validate import compose
from rlcli.ops.advantages import ADVANTAGES, AdvantageInputs, SasTracker, grpo_advantages
from rlcli.rewards.rules import accuracy, dcpo_score, format_match, signed_accuracy, space_rate
from rlcli.rewards.scorer import Sample, Scorer, load_function
from rlcli.train.shaping import informative_groups

THINK_ANSWER = compose(["reward=format"]).reward.pattern
BOXED = compose(["reward=dcpo"]).reward.pattern


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
        # Restating the question is no answer (math-verify alone would evaluate it to 59).
        ("This is a simplified form of 12 + 47", "59", 0.0),
        ("(15 - 65) = ?", "-50", 0.0),
        ("\\boxed{2\\sqrt{3}}", "2\\sqrt{3}", 1.0),  # an expression answer stays allowed
        ("\\boxed{\\sqrt{12}}", "2\\sqrt{3}", 1.0),
        ("\\boxed{\\frac{1}{2}", "0.5", 1.0),  # math-verify forgives an unclosed brace
        ("\\boxed{", "47", 0.0),  # malformed: scored, not a crash
        ("}}}{{{\\\\boxed", "47", 0.0),
    ],
)
def test_math_reward_checks_equivalence_not_strings(response, answer, score):
    assert accuracy(response, answer) == score
    assert signed_accuracy(response, answer) == 2 * score - 1  # DAPO's +1 / -1


@pytest.mark.parametrize(
    ("response", "score"),
    [
        ("<think>12 + 35 is 47</think><answer>47</answer>", 1.0),
        ("<think>\nmulti\nline\n</think>\n<answer>\n47\n</answer>\n", 1.0),
        ("<answer>47</answer>", 0.0),  # no think block
        ("<think>47</think>", 0.0),  # no answer
        ("<think>a</think><answer>47</answer> and then more text", 0.0),  # the whole response
        ("<answer>47</answer><think>a</think>", 0.0),  # wrong order
        ("", 0.0),
    ],
)
def test_format_reward_matches_the_whole_response(response, score):
    assert format_match(response, THINK_ANSWER) == score


@pytest.mark.parametrize(
    ("response", "score"),
    [
        ("so it is \\boxed{47}", 1.0),
        ("so it is \\boxed{46}", 0.0),
        ("so it is 47", -1.0),  # right number, but not in the required format
        ("\\boxed{}", -1.0),
    ],
)
def test_dcpo_reward_is_plus_one_zero_minus_one(response, score):
    assert dcpo_score(response, "47", BOXED) == score


def test_space_rate():
    assert [space_rate(r) for r in ["a b", "abcd", ""]] == [pytest.approx(1 / 3), 0.0, 0.0]


def samples(*responses, answer="47", record=None, length=5):
    return [Sample("What is 12 + 35?", r, answer, record or {}, length) for r in responses]


def scorer(*overrides):
    cfg = compose(["sampler=hf", *overrides])
    return Scorer(cfg.reward, cfg.sampler.max_new_tokens, torch.device("cpu"), "float32")


def test_math_format_mixes_with_weights_and_logs_each_component():
    scores = scorer("reward=math_format")(
        samples(
            "<think>add</think><answer>47</answer>",  # right and well formed
            "<think>add</think><answer>46</answer>",  # wrong, well formed
            "47",  # right, no format
            "nothing",
        )
    )
    assert scores.total.tolist() == pytest.approx([1.0, 0.1, 0.9, 0.0])
    assert scores.components["math"].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert scores.components["format"].tolist() == [1.0, 1.0, 0.0, 0.0]
    metrics = scores.metrics()
    assert metrics["reward/math"] == 0.5 and metrics["reward/format"] == 0.5
    assert metrics["reward/errors"] == 0
    # Any mix and weights: a weight of 0 logs the component without counting it.
    other = scorer("reward=math_format", "reward.weights=[1.0,0.0]")(samples("<think>a</think>"))
    assert other.total.tolist() == [0.0] and "format" in other.components


def test_dapo_reward_adds_the_soft_overlong_punishment():
    # ALGORITHMS.md worked example 4 with L_max = 20, L_cache = 4: lengths 16, 18, 20.
    s = scorer("reward=dapo", "reward.overlong_cache_len=4", "sampler.max_new_tokens=20")
    responses = [Sample("q", "47", "47", {}, n) for n in (16, 18, 20)]
    scores = s(responses)
    assert scores.components["overlong"].tolist() == pytest.approx([0.0, -0.5, -1.0])
    assert scores.total.tolist() == pytest.approx([1.0, 0.5, 0.0])


def test_countdown_component_reads_the_records_numbers_and_target():
    record = {"numbers": [3, 5, 7], "target": 22}
    scores = scorer("reward=countdown")(
        samples("<answer>3 * 5 + 7</answer>", "<answer>3 + 5 + 7</answer>", record=record)
    )
    assert scores.total.tolist() == [1.0, 0.0]


# A module-level reward function, loaded by reward.function=test_rewards:... below.
def fails_on_odd_numbers(prompts, responses, answers, **fields):
    for r in responses:
        if int(r) % 2:
            raise ValueError(f"odd response {r}")
    return [float(r) for r in responses]


def hangs_on_seven(prompts, responses, answers, **fields):
    if "7" in responses:
        while True:  # a user's bug: never returns
            pass
    return [1.0] * len(responses)


def uses_record_fields(prompts, responses, answers, difficulty, **fields):
    return [None if d is None else float(d) for d in difficulty]


def test_a_failing_sample_is_missing_and_the_rest_are_scored():
    s = scorer("reward=python", "reward.function=test_rewards:fails_on_odd_numbers")
    scores = s(samples("2", "3", "4", "5"))
    assert scores.total[[0, 2]].tolist() == [2.0, 4.0]
    assert scores.missing.tolist() == [False, True, False, True]
    assert scores.metrics()["reward/errors"] == 2
    assert "ValueError: odd response 3" in scores.errors[0]


def test_a_sample_that_hangs_times_out_alone():
    s = scorer(
        "reward=python", "reward.function=test_rewards:hangs_on_seven", "reward.timeout_s=0.2"
    )
    start = time.perf_counter()
    scores = s(samples("1", "7", "2"))
    # The batch call times out (3 x 0.2 s), then each sample alone: only "7" times out again.
    assert time.perf_counter() - start < 3
    assert scores.missing.tolist() == [False, True, False]
    assert "RewardTimeout" in scores.errors[0]


def test_python_reward_gets_the_records_fields_and_none_means_missing():
    s = scorer("reward=python", "reward.function=test_rewards:uses_record_fields")
    batch = samples("a", record={"difficulty": 3}) + samples("b", record={"other": 1})
    scores = s(batch)
    assert scores.total[0].item() == 3.0 and math.isnan(scores.total[1].item())


def test_python_reward_loads_from_a_file(tmp_path):
    (tmp_path / "my_reward.py").write_text(
        "def length(prompts, responses, answers, **fields):\n"
        "    return [len(r) for r in responses]\n"
    )
    s = scorer("reward=python", f"reward.function={tmp_path / 'my_reward.py'}:length")
    assert s(samples("abc", "")).total.tolist() == [3.0, 0.0]


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ("no_colon", "is not of the form"),
        ("surely_not_a_module_xyz:f", "importing surely_not_a_module_xyz failed"),
        ("test_rewards:not_there", "has no function 'not_there'"),
        ("/nowhere/r.py:f", "no such file"),
    ],
)
def test_bad_python_reward_specs_are_named(spec, named):
    with pytest.raises(ConfigError, match=named):
        load_function(spec)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["reward.components=[math,nope]"], "'nope', which is not one of the valid components"),
        (["reward=math_format", "reward.weights=[1.0]"], "one finite number per component"),
        (["reward=format", "reward.pattern='a[b'"], "not a valid regular expression"),
        (["reward=python"], "reward.function"),
        (["reward=reward_model"], "reward.model_path"),
        (["reward=process", "reward.model_path=x"], "algo.advantage=grpo_process"),
        (["algo.advantage=grpo_process"], "reward=process"),
        (["reward=dapo", "sampler.max_new_tokens=10"], "reward.overlong_cache_len=12"),
    ],
)
def test_bad_reward_configs_are_named(overrides, named):
    with pytest.raises(ConfigError, match=named):
        compose(overrides)


def test_missing_rewards_are_left_out_of_group_statistics():
    nan = math.nan
    rewards = torch.tensor([[1.0, nan, 0.0, 0.5], [1.0, 1.0, 1.0, 1.0], [nan, nan, 0.0, 1.0]])
    inputs = AdvantageInputs(
        scores=rewards.flatten(), kl_penalty=torch.zeros(12, 1), mask=torch.ones(12, 1),
        group_size=4, prompt_ids=[i for i in "abc" for _ in range(4)], sas=SasTracker(),
    )  # fmt: skip
    advantages, _ = ADVANTAGES["grpo"](inputs)
    advantages = advantages.view(3, 4)
    # Each group as if it held only its scored responses; missing ones get 0.
    assert advantages[0, [0, 2, 3]].tolist() == pytest.approx(
        grpo_advantages(torch.tensor([[1.0, 0.0, 0.5]]))[0].tolist()
    )
    assert advantages[0, 1] == 0 and advantages[1].abs().sum() == 0
    assert advantages[2, [2, 3]].tolist() == pytest.approx([-0.7071, 0.7071], abs=1e-3)
    assert advantages[2, :2].tolist() == [0.0, 0.0]
    assert informative_groups(rewards).tolist() == [True, False, True]


def test_a_step_where_every_reward_fails_stops_with_the_first_error():
    s = scorer("reward=python", "reward.function=test_rewards:fails_on_odd_numbers")
    with pytest.raises(
        ConfigError, match="No response of this batch could be scored .* ValueError: odd response 1"
    ):
        s(samples("1", "3"))


def test_math_reward_grades_the_last_answer_block():
    assert accuracy("<think>maybe 46</think><answer>47</answer>", "47") == 1.0
    assert accuracy("<answer>46</answer> no wait <answer>47</answer>", "47") == 1.0
    assert accuracy("<think>it is 47</think><answer>46</answer>", "47") == 0.0


def test_math_reward_grades_the_math_fixtures_latex_answers():
    from rlcli.data import load_splits

    fixture = str(Path(__file__).parent / "fixtures" / "math.jsonl")
    problems, _ = load_splits(
        compose(["data=math", f"data.path={fixture}", "data.num_test=0"]).data
    )
    for p in problems:  # "\frac{1}{2}", "2\sqrt{3}"-style answers, read as LaTeX
        assert accuracy(f"So the answer is $\\boxed{{{p.answer}}}$.", p.answer) == 1.0, p.answer
        assert accuracy("So the answer is $\\boxed{12345}$.", p.answer) == 0.0, p.answer
