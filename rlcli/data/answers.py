"""Answer formats: the ground truth as a record's answer field writes it (`data.answer_format`).
Each returns the answer, or None when the text holds none."""

from __future__ import annotations

import re
from collections.abc import Callable


def plain_answer(text: str) -> str | None:
    return text.strip() or None


def gsm8k_answer(text: str) -> str | None:
    """GSM8K's solutions end in "#### 1,234": the number after the last ####, commas removed."""
    if "####" not in text:
        return None
    return text.rsplit("####", 1)[1].replace(",", "").strip() or None


_BOXED = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])(\s*)")


def boxed_answer(text: str) -> str | None:
    """The content of the last \\boxed{...} of a MATH solution, braces matched, so
    \\boxed{\\frac{1}{2}} gives \\frac{1}{2}. MATH also writes \\boxed 5 for one token."""
    matches = list(_BOXED.finditer(text))
    if not matches:
        return None
    start = matches[-1].end()
    if text[start : start + 1] != "{":
        if not matches[-1].group(1):
            return None
        token = re.match(r"[^\s$]+", text[start:])
        return token.group(0) if token else None
    depth = 0
    for end in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[end], 0)
        if depth == 0:
            return text[start + 1 : end].strip() or None
    return None  # unbalanced braces


ANSWER_FORMATS: dict[str, Callable[[str], str | None]] = {
    "plain": plain_answer,
    "gsm8k": gsm8k_answer,
    "boxed": boxed_answer,
}
