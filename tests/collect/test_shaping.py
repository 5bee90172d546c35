"""Batch shaping on real rollouts of the tiny model: DAPO dynamic sampling and overlong
filtering, DUPO fill, re-padding when rollouts are joined, and DCPO state in checkpoints."""

import json
import random

import pytest
import torch

from rlcli.collect.shaping import dupo_fill, filter_values, group_rows, informative_groups
from rlcli.config import ConfigError
from rlcli.rewards.rules import space_rate
from rlcli.rewards.scorer import Scores
from rlcli.rollout.batch import concat_rollouts, select_rows
from rlcli.train.forward import batch_logprobs
from rlcli.train.loop import train
from rlcli.train.run import setup
from rlcli.train.step import train_step
from rlcli.validate import compose


def test_informative_groups_and_dupo_fill():
    rewards = torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [0.5, 0.2]])
    informative = informative_groups(rewards).tolist()
    assert informative == [False, True, False, True]
    slots = dupo_fill(informative, random.Random(0))
    assert len(slots) == 4 and slots[1] == 1 and slots[3] == 3
    assert slots[0] in (1, 3) and slots[2] in (1, 3)
    assert dupo_fill([False, False], random.Random(0)) == [0, 1]
    assert group_rows([2, 0], 3) == [6, 7, 8, 0, 1, 2]


def tiny_run(*overrides):
    return setup(compose(["model=tiny", *overrides]))


@pytest.fixture(scope="module")
def run():
    return tiny_run("reward=space_rate", "trainer.prompts_per_step=2")


def test_concat_rollouts_keeps_each_responses_log_probs(run):
    short = run.sampler.sample(["Hi"], 2, ["a"], ["0"])
    long = run.sampler.sample(["Hello there, how are you doing today?"], 2, ["b"], ["0"])
    joined = concat_rollouts([short, long], run.tokenizer.pad_token_id)
    assert joined.prompt_width == long.prompt_width and joined.texts == short.texts + long.texts
    got = batch_logprobs(run.policy, joined, 8)
    for part, rows in ((short, [0, 1]), (long, [2, 3])):
        want = batch_logprobs(run.policy, part, 8)
        t = want.shape[1]
        assert torch.allclose(
            got[rows, :t] * part.response_mask, want * part.response_mask, atol=1e-5
        )
    picked = select_rows(joined, [3, 0])
    assert picked.texts == [joined.texts[3], joined.texts[0]] and picked.prompt_ids == ["b", "a"]


def test_dynamic_sampling_stops_with_a_clear_message():
    # The tiny random model never answers arithmetic: every group is all-zero reward.
    run = tiny_run(
        "algo=dapo",
        "algo.max_gen_batches=2",
        "sampler.max_new_tokens=16",
    )
    with pytest.raises(ConfigError, match="found only 0 of 4 groups .* algo.max_gen_batches=2"):
        run.collector.next_batch()


def test_dynamic_sampling_keeps_only_informative_groups():
    run = tiny_run("algo=dapo", "reward=space_rate", "sampler.max_new_tokens=16")
    collected = run.collector.next_batch()
    batch, scores, metrics = collected.rollout, collected.scores, collected.metrics
    assert len(batch.texts) == 16 and metrics["batch/gen_batches"] >= 1
    assert informative_groups(scores.view(4, 4)).all()


def always_right(prompts, responses, answers, **fields):
    """Every response correct: a group of these carries no accuracy signal."""
    return [1.0] * len(responses)


def test_dynamic_sampling_filters_on_correctness_not_on_the_total():
    # DAPO eq. 11: an all-correct group is dropped although shaping (here the whitespace share,
    # as the soft overlong punishment would) makes its totals differ; filter_metric=total keeps it.
    both = ["reward=python", "reward.function=test_shaping:always_right"]
    both += ["reward.components=[python,space_rate]", "sampler.max_new_tokens=16"]
    run = tiny_run("algo=dapo", "algo.max_gen_batches=2", *both)
    with pytest.raises(ConfigError, match="whose correctness .* differs"):
        run.collector.next_batch()
    run = tiny_run("algo=dapo", "algo.filter_metric=total", *both)
    collected = run.collector.next_batch()
    batch, metrics = collected.rollout, collected.metrics
    assert len(batch.texts) == 16 and metrics["batch/gen_batches"] == 1


def test_filter_values_read_the_correctness_component():
    # The example: totals 1, 1, 0.5, 1 from an all-correct group, one response punished
    # for length. On the total the group looks informative; on correctness it is not.
    total = torch.tensor([1.0, 1.0, 0.5, 1.0])
    parts = {"math_pm1": torch.ones(4), "overlong": torch.tensor([0.0, 0.0, -0.5, 0.0])}
    scores = Scores(total, parts, [], None)
    correct = filter_values(scores, "correctness", ["math_pm1"])
    assert not informative_groups(correct.view(1, 4)).any()
    assert informative_groups(filter_values(scores, "total", ["math_pm1"]).view(1, 4)).all()


def half_constant_reward(prompts, responses, answers, **fields):
    """Constant 1.0 for prompts with an even answer (all-equal groups), else whitespace share."""
    pairs = zip(responses, answers, strict=True)
    return [1.0 if int(a) % 2 == 0 else space_rate(r) for r, a in pairs]


def test_dupo_fill_replaces_all_equal_groups():
    run = tiny_run(
        "algo=dupo",
        "reward=python",
        "reward.function=test_shaping:half_constant_reward",
        "trainer.prompts_per_step=8",
        "sampler.max_new_tokens=8",
    )
    collected = run.collector.next_batch()
    batch, scores, metrics = collected.rollout, collected.scores, collected.metrics
    equal = round(metrics["batch/groups_all_equal"] * 8)
    assert 0 < equal < 8, "the fixture should mix constant and informative groups"
    assert metrics["batch/duplicated_groups"] == equal
    assert len(batch.texts) == 32
    assert informative_groups(scores.view(8, 4)).all()  # every slot now carries signal
    assert len(set(batch.prompt_ids)) == 8 - equal  # the fillers repeat kept prompts


def test_overlong_filter_removes_truncated_responses_from_the_loss():
    # The tiny model never emits EOS, so with overlong filtering nothing is left to learn from.
    run = tiny_run(
        "algo=dapo",
        "reward=space_rate",
        "sampler.max_new_tokens=16",
        "reward.overlong_cache_len=4",
        "algo.dynamic_sampling=false",
    )
    before = [p.clone() for p in run.policy.parameters()]
    metrics = train_step(run)
    assert metrics["response/truncated_frac"] == 1.0
    assert metrics["actor/grad_norm"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, run.policy.parameters(), strict=True))
    # Soft overlong punishment: every response is at the limit, so each gets -1.
    assert metrics["reward/overlong"] == pytest.approx(-1.0)


def test_dcpo_state_is_saved_with_checkpoints(tmp_path):
    cfg = compose(
        [
            "model=tiny",
            "algo=dcpo",
            "reward=space_rate",
            "trainer.max_steps=2",
            "logger.progress=false",
            "trainer.prompts_per_step=2",
        ]
    )
    train(cfg, tmp_path)
    state = json.loads((tmp_path / "checkpoints" / "step_2" / "trainer_state.json").read_text())
    visits = state["estimator_state"]["states"]
    assert sum(count for count, _, _ in visits.values()) == 4  # 2 steps x 2 prompts
    assert state["data_position"] == 4
