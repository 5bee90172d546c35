"""Sampling and scoring together, for training and for the commands that only sample.

`sample_and_score` samples a group per problem (`sample_problems`) and scores every response
(`score_rollout`, the scoring alone, for a batch sampled ahead: `collect.stream`); `scored_chunks`
does so over a whole problem list, chunk by chunk (what `rlcli eval`, `filter` and `pairs`
iterate over).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator

from rlcli.data.problems import Problem, PromptRenderer
from rlcli.rewards.reward_models import step_reward_tensors
from rlcli.rewards.scorer import Sample, Scores
from rlcli.rollout.batch import Rollout
from rlcli.rollout.contract import Sampler


def sample_and_score(
    sampler: Sampler,
    scorer: Callable[[list[Sample]], Scores],
    render: PromptRenderer,
    problems: list[Problem],
    group: int,
    *,
    temperature: float | None = None,
    seed: int | None = None,
    top_p: float | None = None,
) -> tuple[Rollout, Scores]:
    """Sample a group per problem and score every response (NaN where a reward failed).

    `temperature`, `seed` and `top_p` replace the training stream's for this call
    (evaluation)."""
    batch = sample_problems(
        sampler, render, problems, group, temperature=temperature, seed=seed, top_p=top_p
    )
    return score_rollout(scorer, render, problems, group, batch)


def sample_problems(
    sampler: Sampler, render: PromptRenderer, problems: list[Problem], group: int, **options
) -> Rollout:
    """A group of `group` responses per problem, its prompt rendered; `options` (temperature,
    seed, top_p) as `Sampler.sample` takes them."""
    prompts = [render.prompt(p) for p in problems]
    ids, answers = [p.id for p in problems], [p.answer for p in problems]
    return sampler.sample(prompts, group, ids, answers, **options)


def score_rollout(
    scorer: Callable[[list[Sample]], Scores],
    render: PromptRenderer,
    problems: list[Problem],
    group: int,
    batch: Rollout,
) -> tuple[Rollout, Scores]:
    """Score every response of `batch`, sampled as `group` responses per problem; a process
    reward's step scores go into the rollout."""
    rows = [p for p in problems for _ in range(group)]
    # Each response's tokens up to its padding (tool turns too): views, no copies.
    widths = batch.attention_mask[:, batch.prompt_width :].sum(-1).tolist()
    samples = [
        Sample(
            p.question,
            text,
            p.answer,
            p.record,
            int(n),
            p.id,
            batch.response_ids[i, :width],
            conversation=p.conversation,
        )  # fmt: skip
        for i, (p, text, n, width) in enumerate(
            zip(rows, batch.texts, batch.lengths.tolist(), widths, strict=True)
        )
    ]
    if batch.episodes is not None:  # env=...: each episode's transcript, for samples.jsonl
        episodes = zip(samples, batch.episodes, strict=True)
        samples = [dataclasses.replace(s, episode=e) for s, e in episodes]
    if (spans := batch.spanned_versions) is not None:  # rollout workers: the weights it spans
        samples = [dataclasses.replace(s, versions=v) for s, v in zip(samples, spans, strict=True)]
    scores = scorer(samples)
    if scores.steps is not None:  # process reward: each step's score at its last token
        step_rewards, step_ends = step_reward_tensors(
            render.tokenizer, batch.response_ids.cpu(), batch.response_mask.cpu(), scores.steps
        )
        marked = step_rewards.masked_fill(~step_ends, math.nan)
        inputs = {**batch.estimator_inputs, "step_rewards": marked}
        batch = dataclasses.replace(batch, estimator_inputs=inputs)
    return batch, scores


def scored_chunks(
    sampler: Sampler,
    scorer: Callable[[list[Sample]], Scores],
    render: PromptRenderer,
    problems: list[Problem],
    group: int,
    *,
    chunk_size: int,
    temperature: float | None = None,
    seed: int | None = None,
    top_p: float | None = None,
) -> Iterator[tuple[list[Problem], Rollout, Scores]]:
    """`sample_and_score` over `problems`, `chunk_size` problems a call: yields each chunk
    with its rollout and scores. With `seed`, the chunk starting at problem i is sampled
    with seed + i, so a chunk's samples do not depend on the chunks before it."""
    for start in range(0, len(problems), chunk_size):
        chunk = problems[start : start + chunk_size]
        seed_here = None if seed is None else seed + start
        rollout, scores = sample_and_score(
            sampler, scorer, render, chunk, group, temperature=temperature, seed=seed_here,
            top_p=top_p,
        )  # fmt: skip
        yield chunk, rollout, scores
