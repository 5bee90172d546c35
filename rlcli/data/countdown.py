"""Countdown: reach a target number by combining the given numbers with + - * /.

The task TinyZero trains on: "Using the numbers [12, 45, 7], create an equation that equals
50", each number used exactly once, the equation inside <answer></answer>. Problems are
generated from a seed, with `num_operands` numbers of `difficulty` digits each, and every
target is reachable by construction (`countdown_problem`). `countdown_score` checks a response
without ever running it: the expression is parsed with `ast` and evaluated exactly, with
`fractions.Fraction`, and the answer must also use each given number exactly once.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction

from rlcli.config import ConfigError, DataConfig

# Longer answers are rejected unparsed: a genuine equation over a handful of numbers is far
# shorter, and this bounds the parser's work on hostile input.
MAX_EXPRESSION_CHARS = 300

OPERATORS = "+-*/"
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# Signs a model may write instead of ASCII operators.
_UNICODE_SIGNS = str.maketrans({"×": "*", "·": "*", "÷": "/", "−": "-", "–": "-"})
# The generator's operations: "/" is used only where it divides exactly.
_WHOLE_NUMBER_OPS = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.floordiv,
}
# The checker's: Fraction / Fraction is exact, and / 0 raises ZeroDivisionError.
_ANSWER_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


class UnsafeExpression(ValueError):
    """The answer holds something other than integers, + - * /, unary minus and parentheses."""


@dataclass(frozen=True)
class CountdownProblem:
    numbers: list[int]  # in the order shown to the model (shuffled after construction)
    target: int
    solution: str  # an expression that reaches the target, using every number once


def countdown_problem(
    rng: random.Random, difficulty: int, operators: str, num_operands: int
) -> CountdownProblem | None:
    """One problem, or None when this draw's target is not a positive integer. The generator
    combines random pairs of the numbers with random operators until one value is left, and
    keeps it when it is a positive integer. Its hidden solution divides only where the division
    is exact and never subtracts below zero, so each of its intermediate values is a whole
    number; a model's answer may use any fractions."""
    low = 1 if difficulty == 1 else 10 ** (difficulty - 1)  # no 0: it makes trivial targets
    numbers = [rng.randint(low, 10**difficulty - 1) for _ in range(num_operands)]
    # Combine random pairs until one value is left: any expression tree can arise this way.
    pool = [(n, str(n)) for n in numbers]
    while len(pool) > 1:
        (a, a_text), (b, b_text) = (pool.pop(rng.randrange(len(pool))) for _ in range(2))
        op = rng.choice(operators)
        if op in "-/" and a < b:
            (a, a_text), (b, b_text) = (b, b_text), (a, a_text)  # keep values whole and >= 0
        if op == "/" and (b == 0 or a % b):
            return None
        value = _WHOLE_NUMBER_OPS[op](a, b)
        pool.append((value, f"({a_text} {op} {b_text})"))
    target, text = pool[0]
    if target < 1:
        return None
    rng.shuffle(numbers)
    return CountdownProblem(numbers, target, text[1:-1] if num_operands > 1 else text)


def countdown_prompt(numbers: list[int], target: int, operators: str) -> str:
    ops = " ".join(operators)
    return (
        f"Using the numbers {numbers}, create an equation that equals {target}. "
        f"Use each number exactly once, with the operations {ops} and parentheses. "
        "Put the equation alone inside <answer> </answer>, for example <answer>(1 + 2) * 3"
        "</answer>."
    )


def _check_config(cfg: DataConfig) -> None:
    bad = set(cfg.operators) - set(OPERATORS)
    if bad or not cfg.operators:
        raise ConfigError(
            f"data.operators={cfg.operators!r} is not allowed for data=countdown: use a string "
            f"of + - * / (e.g. '{OPERATORS}')."
        )
    if cfg.difficulty < 1 or cfg.num_operands < 2:
        raise ConfigError(
            f"data.difficulty={cfg.difficulty} and data.num_operands={cfg.num_operands} are not "
            "allowed: countdown needs difficulty >= 1 (digits per number) and num_operands >= 2."
        )


def countdown_records(cfg: DataConfig) -> tuple[list[dict], list[dict]]:
    """Seeded train/test records {question, answer, numbers, target}; no multiset of numbers
    with its target is in both splits. data.py turns them into `Problem`s."""
    _check_config(cfg)
    rng = random.Random(cfg.seed)
    wanted = cfg.num_train + cfg.num_test
    seen: dict[tuple, CountdownProblem] = {}
    for _ in range(wanted * 20):
        if len(seen) == wanted:
            break
        problem = countdown_problem(rng, cfg.difficulty, cfg.operators, cfg.num_operands)
        if problem is not None:
            seen.setdefault((tuple(sorted(problem.numbers)), problem.target), problem)
    problems = list(seen.values())
    test, train = problems[: cfg.num_test], problems[cfg.num_test :]
    if not train:
        raise ConfigError(
            f"data.difficulty={cfg.difficulty}, data.operators={cfg.operators!r} and "
            f"data.num_operands={cfg.num_operands} give too few distinct countdown problems "
            f"for num_train={cfg.num_train} and num_test={cfg.num_test}."
        )

    def record(p: CountdownProblem) -> dict:
        text = f"{countdown_prompt(p.numbers, p.target, cfg.operators)} {cfg.instruction}"
        return {
            "question": text.strip(),
            "answer": str(p.target),
            "numbers": list(p.numbers),
            "target": p.target,
        }

    return [record(p) for p in train], [record(p) for p in test]


def extract_answer(response: str) -> str:
    """The last <answer>...</answer>, else the response's last non-empty line."""
    tagged = _ANSWER_TAG.findall(response)
    if tagged:
        return tagged[-1].strip()
    lines = [line for line in response.splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def _evaluate(node: ast.AST, used: list[int]) -> Fraction:
    """Exact value of a whitelisted expression tree (only integer constants, + - * /, unary
    minus and parentheses, with `fractions.Fraction`); records the integers it uses."""
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, used)
    if isinstance(node, ast.BinOp) and type(node.op) in _ANSWER_OPS:
        left, right = _evaluate(node.left, used), _evaluate(node.right, used)
        return _ANSWER_OPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand, used)
    # bool is an int subclass: `True` is a constant too, and is not a number here.
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    raise UnsafeExpression(f"{type(node).__name__} is not allowed in an answer")


def parse_expression(expr: str) -> tuple[Fraction, list[int]]:
    """The exact value of `expr` and the integers it uses. Never runs code: the text is only
    parsed, and any node but integers, + - * /, unary minus and parentheses is rejected.
    Raises UnsafeExpression, SyntaxError or ZeroDivisionError."""
    if len(expr) > MAX_EXPRESSION_CHARS:
        raise UnsafeExpression(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    tree = ast.parse(expr.translate(_UNICODE_SIGNS).strip(), mode="eval")
    used: list[int] = []
    return _evaluate(tree, used), used


def countdown_score(response: str, numbers: list[int], target: int) -> float:
    """1.0 when the response's answer uses each of `numbers` exactly once and equals `target`.

    The answer is the last <answer>...</answer> (else the last line); a trailing `= value`
    is ignored, so "(3 + 5) * 2 = 16" is read as "(3 + 5) * 2". Anything else scores 0.0."""
    expr = extract_answer(response).split("=")[0]
    try:
        value, used = parse_expression(expr)
    # UnsafeExpression is a ValueError; the parser raises the others on hostile input.
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, MemoryError):
        return 0.0
    if Counter(used) != Counter(numbers):
        return 0.0
    return 1.0 if value == target else 0.0
