"""A scored response as a step hands it on for the table of samples (samples.jsonl, W&B):
`scored_samples` pairs the scorer's input with its output, one row per response."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rlcli.rewards.scorer import Sample, Scores


@dataclass(frozen=True)
class ScoredSample:
    """One sampled response as the table of samples shows it."""

    prompt: str  # the question, before chat rendering
    response: str
    answer: str  # ground truth
    reward: float  # NaN when the reward failed
    problem_id: str = ""
    components: dict = dataclasses.field(default_factory=dict)  # each component's own score
    length: int = 0  # response tokens
    episode: dict | None = None  # env=...: the whole episode (`env.episode.Episode.transcript`)
    versions: list[int] | None = None  # rollout workers: the weight versions its tokens span
    conversation: tuple[dict, ...] | None = None  # conversational data: the prompt's messages


def scored_samples(samples: list[Sample], scores: Scores) -> list[ScoredSample]:
    """Each of `samples` with its total reward and each component's score."""
    parts = {name: values.tolist() for name, values in scores.components.items()}
    return [
        ScoredSample(
            s.question,
            s.response,
            s.answer,
            reward,
            s.problem_id,
            {name: values[i] for name, values in parts.items()},
            s.length,
            s.episode,
            s.versions,
            s.conversation,
        )
        for i, (s, reward) in enumerate(zip(samples, scores.total.tolist(), strict=True))
    ]
