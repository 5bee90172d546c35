"""Prompt datasets: each yields `Problem`s (an id, the chat-rendered prompt, the answer).

`arith` generates arithmetic problems from a seed; `jsonl` reads the user's file. Both give
a train and a held-out test split and render prompts with the model's chat template.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from rlcli.config import ConfigError, DataConfig


@dataclass(frozen=True)
class Problem:
    """One prompt: `id` is stable across runs (DCPO keys its state on it)."""

    id: str
    question: str
    answer: str


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


def arith_splits(cfg: DataConfig) -> tuple[list[Problem], list[Problem]]:
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

    def make(split, rows):
        return [
            Problem(f"arith-{split}-{i}", f"What is {q}? {cfg.instruction}".strip(), a)
            for i, (q, a) in enumerate(rows)
        ]

    return make("train", train), make("test", test)


def _read_jsonl(path: str, cfg: DataConfig, split: str) -> list[Problem]:
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"data.{split}={path}: no such file.")
    problems = []
    with file.open() as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ConfigError(f"{path}:{line_no} is not valid JSON ({err.msg}).") from None
            missing = [k for k in (cfg.prompt_field, cfg.answer_field) if k not in record]
            if missing:
                raise ConfigError(
                    f"{path}:{line_no} has no field {missing[0]!r} (fields present: "
                    f"{', '.join(record)}); set data.prompt_field / data.answer_field."
                )
            text = f"{record[cfg.prompt_field]} {cfg.instruction}".strip()
            problems.append(Problem(f"{file.stem}-{line_no}", text, str(record[cfg.answer_field])))
    if not problems:
        raise ConfigError(f"data.{split}={path} holds no records.")
    return problems


def jsonl_splits(cfg: DataConfig) -> tuple[list[Problem], list[Problem]]:
    train = _read_jsonl(cfg.path, cfg, "path")
    if cfg.test_path:
        return train, _read_jsonl(cfg.test_path, cfg, "test_path")
    random.Random(cfg.seed).shuffle(train)
    return train[cfg.num_test :], train[: cfg.num_test]


def load_splits(cfg: DataConfig) -> tuple[list[Problem], list[Problem]]:
    return {"arith": arith_splits, "jsonl": jsonl_splits}[cfg.name](cfg)


def render_prompt(tokenizer, question: str, system_prompt: str | None) -> str:
    """The question as the model's chat template renders a user turn, ready for the reply."""
    messages = [{"role": "user", "content": question}]
    if system_prompt is not None:
        messages.insert(0, {"role": "system", "content": system_prompt})
    if tokenizer.chat_template is None:
        return question
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


class PromptStream:
    """Shuffled passes over the training split, seeded; `position` makes resume exact."""

    def __init__(self, problems: list[Problem], seed: int, position: int = 0):
        self.problems, self.seed, self.position = problems, seed, position

    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.problems)))
        random.Random(self.seed * 100_003 + epoch).shuffle(order)
        return order

    def take(self, n: int) -> list[Problem]:
        out, order, order_epoch = [], [], -1
        for _ in range(n):
            epoch, index = divmod(self.position, len(self.problems))
            if epoch != order_epoch:
                order, order_epoch = self._order(epoch), epoch
            out.append(self.problems[order[index]])
            self.position += 1
        return out
