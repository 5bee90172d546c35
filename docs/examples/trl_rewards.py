"""Reward functions written for TRL's GRPOTrainer, which rlcli calls as they are: two of them,
weighted, in the example of docs/data-and-reward.md. Each record field (`answer`, `unit`) comes
as a keyword list, one entry per completion."""

import re

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def correct(prompts, completions, answer, **kwargs):
    """1.0 when the completion's last number is the record's answer, else 0.0."""
    scores = []
    for completion, expected in zip(completions, answer, strict=True):
        numbers = NUMBER.findall(completion)
        scores.append(float(bool(numbers) and float(numbers[-1]) == float(expected)))
    return scores


def names_the_unit(prompts, completions, unit, **kwargs):
    """1.0 when the completion names the record's unit (minutes, eggs, ...), else 0.0."""
    return [float(name in completion) for completion, name in zip(completions, unit, strict=True)]
