"""How a user's reward function is called: rlcli's convention or TRL's, read from its signature.

- rlcli's: `fn(prompts, responses, answers, **fields)`, prompts and responses as text;
- TRL's (`GRPOTrainer(reward_funcs=...)`): `fn(prompts, completions, **kwargs)`, prompts and
  completions in the dataset's format, as TRL gives them (`trl_prompt_and_completion`).
Either returns one float per response (None: no reward for that response). `call_plan` reads
the signature when the worker imports the function, `call_keywords` makes a call's keywords and
`read_scores` checks what it returns; docs/data-and-reward.md gives the whole contract. Standard
library only: the worker process imports this module.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass

# The keywords every call offers, besides the record's fields (a field of one of these names
# is not passed: the call's own value wins).
OFFERED = ("prompts", "responses", "completions", "answers", "completion_ids", "trainer_state")
# What a function with **kwargs is given besides the record's fields, by the name its
# signature gives the responses; one that names neither gets both names.
BASE = {
    "completions": ("prompts", "completions", "completion_ids", "trainer_state"),  # TRL
    "responses": ("prompts", "responses", "answers"),  # rlcli
    None: ("prompts", "responses", "completions", "answers", "completion_ids", "trainer_state"),
}
CONVENTIONS = (
    "rlcli's fn(prompts, responses, answers, **fields), or TRL's fn(prompts, completions, "
    "**kwargs). In both, the record's other fields (a data file's columns, such as solution) "
    "come as keyword lists, and completion_ids (token ids) and trainer_state when the "
    "function names them; it returns one float per response (None = no reward)"
)


# The largest magnitude a float32 holds. Rewards are kept in float32 tensors, where a larger
# one becomes inf, and one inf reward makes the whole step's advantages NaN.
FLOAT32_MAX = 3.4028234663852886e38


class BadSignature(Exception):
    """The function's parameters fit neither convention; the message says why."""


@dataclass(frozen=True)
class CallPlan:
    """What one function is given at each call."""

    named: tuple[str, ...]  # the parameters it names that a keyword can fill
    any_keyword: bool  # it takes **kwargs: `base` and every record field too
    base: tuple[str, ...]
    fields: tuple[str, ...]  # parameters without a default no call offers: record fields


def call_plan(fn: Callable, label: str) -> CallPlan:
    """How `fn` is called, from its signature; BadSignature, naming `label` (what the user
    wrote) and the parameters, when it fits neither convention: a config error before any model
    loads. The fields it requires (`CallPlan.fields`) are checked against the data before
    training starts."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a C function: no signature to read; given everything
        return CallPlan((), True, BASE[None], ())
    params = list(signature.parameters.values())
    by_keyword = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    named = tuple(p.name for p in by_keyword)
    any_keyword = any(p.kind is p.VAR_KEYWORD for p in params)
    responses = next((name for name in ("completions", "responses") if name in named), None)
    positional = [p.name for p in params if p.kind is p.POSITIONAL_ONLY and p.default is p.empty]
    if positional:
        why = f"its parameter {positional[0]!r} can only be given by position"
    elif responses is None and not any_keyword:
        why = "it names neither completions nor responses, and takes no **kwargs"
    else:
        fields = tuple(p.name for p in by_keyword if p.default is p.empty and p.name not in OFFERED)
        return CallPlan(named, any_keyword, BASE[responses], fields)
    name = getattr(fn, "__name__", "the function")
    raise BadSignature(
        f"{label}: {name}{signature} cannot be called with the batch ({why}). rlcli calls a "
        f"reward function with keywords, in one of two conventions: {CONVENTIONS}."
    )


def call_keywords(
    plan: CallPlan,
    prompts: list[str],
    responses: list[str],
    answers: list[str],
    records: list[dict],
    token_ids: Callable[[], list[list[int]]],
    conversations: list[Sequence[dict] | None] | None = None,
    trainer_state: dict | None = None,
) -> dict[str, list]:
    """The keywords of one call over a batch, each a list with one entry per response (but
    `trainer_state`, one dict). `token_ids` is called only for a function given completion_ids.
    `conversations`: each response's prompt as chat messages (None: a text prompt), which a
    function in TRL's convention gets as its prompt, with its completion as a message."""
    fields = [k for k in dict.fromkeys(k for r in records for k in r) if k not in OFFERED]
    wanted = [*plan.named, *(plan.base + tuple(fields) if plan.any_keyword else ())]
    conversations = conversations or [None] * len(responses)
    trl = [
        trl_prompt_and_completion(p, r, c)
        for p, r, c in zip(prompts, responses, conversations, strict=True)
    ]
    offered = {
        # TRL's convention: its prompts and completions in the dataset's format
        "prompts": [p for p, _ in trl] if "completions" in plan.base else prompts,
        "responses": responses,
        "completions": [c for _, c in trl],
        "answers": answers,
        "trainer_state": trainer_state or {},
    }
    out = {}
    for key in dict.fromkeys(wanted):
        if key in offered:
            out[key] = offered[key]
        elif key == "completion_ids":
            out[key] = token_ids()
        elif key in fields:
            out[key] = [r.get(key) for r in records]
    return out


def trl_prompt_and_completion(prompt: str, response: str, conversation: Sequence[dict] | None):
    """(prompt, completion) as TRL gives them to a reward function: text for a text prompt;
    for a conversation, its messages and the response as an assistant message. A conversation
    that ends with an assistant message, which the model continued, gives that message up and
    its text starts the completion (TRL's "bootstrap")."""
    # Imported here: the reward worker imports this module, and rlcli.data would slow each
    # worker's start (see docs/performance.md, "Start-up: what is imported late"); only the
    # parent builds the keywords.
    from rlcli.data.problems import content_text

    if conversation is None:
        return prompt, response
    messages, start = list(conversation), ""
    if messages[-1]["role"] == "assistant":
        start = content_text(messages.pop()["content"])
    return messages, [{"role": "assistant", "content": start + response}]


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def as_score(value) -> float:
    """A finite float, or NaN for None (a function's way of saying 'no score'); ValueError for
    anything else, as for NaN: the sample's score is then missing, counted in reward/errors.

    bool, int, float and numpy scalars are numbers; a string is not, even "1.0"; neither is a
    number beyond float32's range, where the scorer keeps rewards."""
    if value is None:
        return math.nan
    not_a_number = f"returned {_short(value)}, a {type(value).__name__}, not a number"
    if isinstance(value, (str, bytes)):
        raise ValueError(not_a_number)
    try:
        score = float(value)
    except OverflowError:  # an int beyond even float64
        score = None
    except Exception:
        raise ValueError(not_a_number) from None
    if score is not None and not math.isfinite(score):
        raise ValueError(f"returned {_short(value)}, not a finite number")
    if score is None or abs(score) > FLOAT32_MAX:
        raise ValueError(
            f"returned {_short(value)}, beyond the range of float32 (|reward| <= 3.4e38), in "
            "which rewards are kept: scale it down"
        )
    return score


def read_scores(out, n: int) -> dict:
    """What a call returned over `n` responses, as the worker's reply: {"scores": [float or
    None], "invalid": [[i, why], ...]}, or {"error": why} for the whole call (with
    "miscounted": true when it returned a score count other than `n`). A list, tuple,
    array or generator of one score per response is read in order; a string, a mapping or a
    set is refused: a set has no order to match its scores to the responses."""
    if isinstance(out, (str, bytes, Mapping, Set)):
        return {"error": f"returned a {type(out).__name__}, not a list of scores"}
    out = list(out)
    if len(out) != n:
        # Not retried response by response: one score per prompt, say, would then "work" and
        # silently change what a batch-wise reward computes.
        why = f"returned {len(out)} scores for {n} responses (one score per response is needed)"
        return {"error": why, "miscounted": True}
    scores, invalid = [], []
    for i, value in enumerate(out):
        try:
            score = as_score(value)
        except ValueError as err:
            score = math.nan
            invalid.append([i, str(err)])
        scores.append(None if math.isnan(score) else score)
    return {"scores": scores, "invalid": invalid}
