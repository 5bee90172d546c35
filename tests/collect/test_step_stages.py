"""The step's stages alone, each in well under a second: collect (sample, score, shape) with a
scripted sampler, and the advantages and loss masks made from what it collects.

The sampler is a fake on purpose: it answers each problem with the texts a test scripts for it,
so that what is tested is the wiring of the stages (which rows are kept, what rides with them,
what reaches the estimator), not a model; the training runs elsewhere use real samplers.
"""

import random

import pytest
import torch

from rlcli.collect.collector import Collector, Shaping
from rlcli.data.problems import Problem, PromptRenderer, PromptStream
from rlcli.ops.advantages import ADVANTAGES, AdvantageInputs
from rlcli.ops.estimate import estimate
from rlcli.rewards.scorer import Scores
from rlcli.rollout.batch import rollout_from_tokens
from rlcli.rollout.contract import Sampler
from rlcli.runtime.models import load_tokenizer
from rlcli.train.step import left_out_of_the_loss


class ScriptedSampler(Sampler):
    """Answers problem `id` with the next texts of `scripts[id]` (one per response); a greedy
    call (temperature 0) with `greedy[id]`."""

    device = torch.device("cpu")

    def __init__(self, tokenizer, scripts: dict[str, list[str]], greedy: dict[str, str]):
        self.tokenizer, self.scripts, self.greedy = tokenizer, scripts, greedy

    def sample(self, prompts, group_size, prompt_ids, answers, temperature=None, seed=None,
               top_p=None):  # fmt: skip
        texts = [
            self.greedy[i] if temperature == 0 else self.scripts[i].pop(0)
            for i in prompt_ids
            for _ in range(group_size)
        ]
        encode = self.tokenizer
        return rollout_from_tokens(
            [encode(p)["input_ids"] for p in prompts for _ in range(group_size)],
            [encode(t, add_special_tokens=False)["input_ids"] for t in texts],
            texts=texts,
            prompt_ids=[i for i in prompt_ids for _ in range(group_size)],
            pad_id=self.tokenizer.pad_token_id,
            device=self.device,
            answers=[a for a in answers for _ in range(group_size)],
        )

    def sync(self, policy):
        raise AssertionError("collecting never syncs")


def correct(samples) -> Scores:
    """1 when the response is the answer, 0 when not, NaN (failed) for "?"."""
    total = torch.tensor(
        [float("nan") if s.response == "?" else float(s.response == s.answer) for s in samples]
    )
    return Scores(total=total, components={"correct": total.clone()}, errors=[])


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


ANY_GROUP = Shaping(components=("correct",))  # keeps every group; "correct" is what it judges


def collector(tokenizer, sampler, shaping=ANY_GROUP, needs=frozenset(), problems=2, group=2):
    stream = PromptStream([Problem(f"p{i}", f"{i} + 0 =", str(i)) for i in range(problems)], 0)
    render = PromptRenderer(tokenizer, None)
    return Collector(sampler=sampler, scorer=correct, render=render, prompts=stream,
                     prompts_per_step=problems, group_size=group, shaping=shaping, needs=needs,
                     rng=random.Random(0))  # fmt: skip


def test_collect_scores_every_response_and_reports_the_rewards(tokenizer):
    sampler = ScriptedSampler(tokenizer, {"p0": ["0", "1"], "p1": ["1", "1"]}, {})
    collected = collector(tokenizer, sampler).next_batch()
    order = collected.rollout.prompt_ids  # the stream's shuffled order, groups together
    assert order in (["p0", "p0", "p1", "p1"], ["p1", "p1", "p0", "p0"])
    expected = {"p0": [1.0, 0.0], "p1": [1.0, 1.0]}
    assert collected.scores.tolist() == expected[order[0]] + expected[order[2]]
    assert collected.metrics["reward/mean"] == 0.75
    assert collected.metrics["batch/groups_all_equal"] == 0.5  # p1's two are both right
    assert [s.response for s in collected.samples] == collected.rollout.texts
    assert collected.rollout.estimator_inputs == {}  # no estimator asked for anything


def test_dynamic_sampling_keeps_informative_groups_from_several_rounds(tokenizer):
    # Round 1: p0's group is all right (dropped), p1's differs; round 2: both differ.
    scripts = {"p0": ["0", "0", "0", "5"], "p1": ["1", "9", "1", "9"]}
    sampler = ScriptedSampler(tokenizer, scripts, {})
    shaping = Shaping(dynamic_sampling=True, max_gen_batches=3, components=("correct",))
    collected = collector(tokenizer, sampler, shaping).next_batch()
    assert collected.metrics["batch/gen_batches"] == 2.0
    assert collected.metrics["batch/groups_short"] == 0.0
    # p1's group from round 1, then round 2's first group (the stream's order decides which).
    assert collected.rollout.prompt_ids[:2] == ["p1", "p1"]
    for row in range(0, 4, 2):  # every group kept has one right and one wrong answer
        assert sorted(collected.scores[row : row + 2].tolist()) == [0.0, 1.0]
    assert len(collected.samples) == 8  # the dropped group's responses are in the table too


def test_a_greedy_baseline_rides_with_its_rows_into_the_estimator(tokenizer):
    # ReMax: one greedy reply per problem, scored, as `greedy_scores`; p1's greedy reward fails.
    scripts = {"p0": ["0", "7"], "p1": ["1", "1"]}
    sampler = ScriptedSampler(tokenizer, scripts, greedy={"p0": "0", "p1": "?"})
    collected = collector(tokenizer, sampler, needs=frozenset({"greedy"})).next_batch()
    rollout, scores = collected.rollout, collected.scores
    greedy = rollout.estimator_inputs["greedy_scores"]
    by_id = dict(zip(rollout.prompt_ids, greedy.tolist(), strict=True))
    assert by_id["p0"] == 1.0 and torch.isnan(torch.tensor(by_id["p1"]))

    kept = left_out_of_the_loss(rollout, scores, overlong_filter=False)
    rows_p1 = [i for i, p in enumerate(rollout.prompt_ids) if p == "p1"]
    assert kept.response_mask[rows_p1].sum() == 0  # no baseline: out of the loss
    assert kept.response_mask.sum() == rollout.response_mask[[
        i for i in range(4) if i not in rows_p1
    ]].sum()  # fmt: skip

    x = AdvantageInputs(scores=scores, kl_penalty=torch.zeros(rollout.response_mask.shape),
                        mask=kept.response_mask, group_size=2, prompt_ids=rollout.prompt_ids,
                        **rollout.estimator_inputs)  # fmt: skip
    advantages, _ = estimate(ADVANTAGES["remax"], {}, x)
    pairs = zip(rollout.prompt_ids, scores.tolist(), strict=True)
    expected = [s - 1.0 if p == "p0" else 0.0 for p, s in pairs]
    assert advantages.tolist() == expected
