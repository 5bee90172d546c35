"""A reward function of your own, for the tutorial on docs/data-and-reward.md:

    rlcli train data=jsonl data.path=docs/examples/my_problems.jsonl \
        reward=python reward.function=docs/examples/my_reward.py:score
"""

import re

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def score(prompts, responses, answers, unit, **fields):
    """1.0 when the response's last number is the answer, plus 0.1 when it names the unit of
    the record's `unit` field; None (no score: the response is left out) without an answer."""
    scores = []
    for response, answer, name in zip(responses, answers, unit, strict=True):
        if not answer:
            scores.append(None)
            continue
        numbers = NUMBER.findall(response)
        right = bool(numbers) and float(numbers[-1]) == float(answer)
        scores.append(float(right) + (0.1 if name and name in response else 0.0))
    return scores
