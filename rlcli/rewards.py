"""Reward functions: (responses, answers) -> one float per response.

Each takes the decoded response texts and the ground-truth answers of their prompts and
returns a list of floats. They are looked up by `reward.name` in `REWARDS`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from math_verify import parse, verify


def math_correct(responses: Sequence[str], answers: Sequence[str]) -> list[float]:
    """1.0 when the response's final answer equals the ground truth mathematically, else 0.0.

    math-verify extracts the answer (a `\\boxed{}`, an "Answer:" line, or the last number or
    expression) and compares values symbolically, so "47", "47.0" and "\\boxed{47}" all count.
    """
    scores = []
    for response, answer in zip(responses, answers, strict=True):
        gold, predicted = parse(answer), parse(response)
        scores.append(float(bool(gold) and bool(predicted) and verify(gold, predicted)))
    return scores


def space_rate(responses: Sequence[str], answers: Sequence[str]) -> list[float]:
    """Share of whitespace characters in the response: a toy reward a random model can learn.

    Random tokens give about 0.1; a policy that favours short space-prefixed tokens reaches
    far more. It needs no answer, so it works with any dataset.
    """
    return [sum(c.isspace() for c in r) / len(r) if r else 0.0 for r in responses]


REWARDS: dict[str, Callable[[Sequence[str], Sequence[str]], list[float]]] = {
    "math": math_correct,
    "space_rate": space_rate,
}
