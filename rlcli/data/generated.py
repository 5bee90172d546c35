"""Generated datasets, from a seed: `arith` (arithmetic problems) and `countdown` (whose
generator and checker are in `data.countdown`)."""

from __future__ import annotations

import random

from rlcli.config import ConfigError, DataConfig
from rlcli.data.countdown import countdown_records
from rlcli.data.problems import Problem, Splits

# --- generated problems: arith here, countdown in countdown.py ------------------------------------


def generated_splits(name: str, train: list[dict], test: list[dict]) -> Splits:
    """Problems from generated records, which hold the full prompt text as "question"."""

    def problems(split: str, records: list[dict]) -> list[Problem]:
        return [
            Problem(f"{name}-{split}-{i}", r["question"], r["answer"], r)
            for i, r in enumerate(records)
        ]

    return problems("train", train), problems("test", test)


def arith_problem(rng: random.Random, difficulty: int, operators: str, num_operands: int):
    """One problem with operands of `difficulty` digits; returns (text, exact integer answer)."""
    low = 0 if difficulty == 1 else 10 ** (difficulty - 1)
    high = 10**difficulty - 1
    numbers = [rng.randint(low, high) for _ in range(num_operands)]
    ops = [rng.choice(operators) for _ in range(num_operands - 1)]
    text = str(numbers[0])
    for op, n in zip(ops, numbers[1:], strict=True):
        text += f" {op.replace('*', '×')} {n}"
    # Evaluate left to right with precedence, without eval(): × binds before + and -.
    terms, signs, current = [], [1], numbers[0]
    for op, n in zip(ops, numbers[1:], strict=True):
        if op == "*":
            current *= n
        else:
            terms.append(current)
            signs.append(1 if op == "+" else -1)
            current = n
    terms.append(current)
    return text, sum(s * t for s, t in zip(signs, terms, strict=True))


def arith_splits(cfg: DataConfig) -> Splits:
    """Seeded train/test problems; the test split holds no question of the train split."""
    bad = set(cfg.operators) - set("+-*")
    if bad or not cfg.operators:
        raise ConfigError(
            f"data.operators={cfg.operators!r} is not allowed: use a string of + - * (e.g. '+-*')."
        )
    if cfg.difficulty < 1 or cfg.num_operands < 2:
        raise ConfigError("data.difficulty must be >= 1 and data.num_operands >= 2.")
    rng = random.Random(cfg.seed)
    seen: dict[str, str] = {}
    # Draw until both splits are full or the space of distinct problems is clearly exhausted.
    wanted = cfg.num_train + cfg.num_test
    for _ in range(wanted * 20):
        if len(seen) == wanted:
            break
        text, value = arith_problem(rng, cfg.difficulty, cfg.operators, cfg.num_operands)
        seen.setdefault(text, str(value))
    items = list(seen.items())
    test, train = items[: cfg.num_test], items[cfg.num_test :]
    if len(train) < 1:
        raise ConfigError(
            f"data.difficulty={cfg.difficulty} allows too few distinct problems for "
            f"num_train={cfg.num_train} and num_test={cfg.num_test}."
        )

    def record(question: str, answer: str) -> dict:
        return {"question": f"What is {question}? {cfg.instruction}".strip(), "answer": answer}

    return generated_splits("arith", [record(*r) for r in train], [record(*r) for r in test])


def countdown_splits(cfg: DataConfig) -> Splits:
    return generated_splits("countdown", *countdown_records(cfg))
