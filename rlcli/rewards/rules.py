"""Rule-based rewards: pure functions of one response (and its ground truth) to a float,
each registered here under its `reward.components` name (`@rule("name")`).

No I/O, no config, no models. A rule's parameters name what it reads, by keyword: the
`response`, the problem's `answer`, `reward.pattern` as `pattern`, or any field of the
problem's record (countdown's `numbers` and `target`). `rewards.scorer` calls them, mixes
them with weights and isolates their failures; reward and process reward models live in
`rewards.reward_models`.
"""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Callable

from math_verify import parse, verify

from rlcli.data.countdown import countdown_score

RULES: dict[str, Callable[..., float]] = {}


def rule(name: str):
    """Register a rule as the reward component `name`."""

    def add(fn: Callable[..., float]) -> Callable[..., float]:
        if name in RULES:
            raise ValueError(f"a reward rule named {name!r} is registered already")
        RULES[name] = fn
        return fn

    return add


def call_rule(fn: Callable[..., float], available: dict) -> float:
    """`fn` called with the values its parameters name, out of `available`."""
    return fn(**{k: available[k] for k in inspect.signature(fn).parameters})


def reads_answer(fn: Callable[..., float]) -> bool:
    """Whether the rule compares a response with the problem's answer."""
    return "answer" in inspect.signature(fn).parameters


# math-verify warns once that its time limits are off; rewards.scorer sets its own.
for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).setLevel(logging.ERROR)

ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
FRACTION = re.compile(r"\s*-?\d+\s*/\s*\d+\s*")


def _is_number(parsed: list) -> bool:
    """Whether math-verify's extraction is one number (12, -3.5, \\frac{1}{2}, 1/2), not
    an expression to evaluate."""
    value, raw = parsed[0], parsed[-1]
    return bool(getattr(value, "is_Number", False)) or (
        isinstance(raw, str) and FRACTION.fullmatch(raw) is not None
    )


@rule("math")
def accuracy(response: str, answer: str) -> float:
    """1.0 when the response's final answer equals the ground truth mathematically, else 0.0.

    math-verify extracts the answer (a `\\boxed{}`, an "Answer:" line, or the last number or
    expression) and compares values symbolically, so "47", "47.0" and "\\boxed{47}" all count.
    A response in the think/answer format is graded on its last <answer> block (math-verify
    finds no number packed between tags, as in "<answer>47</answer>"). math-verify's own
    signal-based time limits are off: `rewards.scorer` puts one limit around the whole call
    (two SIGALRM timers cannot nest).

    When the ground truth is a number, the answer must be a number too: math-verify would
    otherwise evaluate an expression, so restating the question ("12 + 47 is ...") would
    score as the answer 59 (a reward hack SmolLM2 found in arithmetic).
    """
    blocks = ANSWER_BLOCK.findall(response)
    # The ground truth is LaTeX without delimiters (MATH's "2\\sqrt{3}"): math-verify reads
    # LaTeX between $...$ only, and would otherwise take the "2".
    delimited = answer if "$" in answer or "\\boxed" in answer else f"${answer}$"
    gold = parse(delimited, parsing_timeout=None)
    predicted = parse(blocks[-1] if blocks else response, parsing_timeout=None)
    if not gold or not predicted or (_is_number(gold) and not _is_number(predicted)):
        return 0.0
    return float(verify(gold, predicted, timeout_seconds=None))


@rule("math_pm1")
def signed_accuracy(response: str, answer: str) -> float:
    """DAPO's rule reward: +1 for a correct final answer, -1 otherwise (DAPO eq. 13)."""
    return 2.0 * accuracy(response, answer) - 1.0


@rule("format")
def format_match(response: str, pattern: str) -> float:
    """1.0 when the whole response matches the regex `pattern` (`.` also matches newlines)."""
    return float(re.fullmatch(pattern, response, flags=re.DOTALL) is not None)


@rule("dcpo")
def dcpo_score(response: str, answer: str, pattern: str) -> float:
    """DCPO's reward: -1 when the response breaks the format, else +1 correct / 0 wrong."""
    if not format_match(response, pattern):
        return -1.0
    return accuracy(response, answer)


@rule("space_rate")
def space_rate(response: str) -> float:
    """Share of whitespace characters in the response: a toy reward a random model can learn.

    Random tokens give about 0.1; a policy that favours short space-prefixed tokens reaches
    far more. It needs no answer, so it works with any dataset.
    """
    return sum(c.isspace() for c in response) / len(response) if response else 0.0


@rule("countdown")
def countdown(response: str, numbers: list, target: int) -> float:
    """Countdown's score (`data.countdown`): the equation uses the numbers and hits the target."""
    return countdown_score(response, numbers, target)
