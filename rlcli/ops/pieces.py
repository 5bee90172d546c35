"""What a piece of the objective declares, read from its own definition: the inputs it takes,
its settings, and what it needs from the run.

A piece (a per-token loss, an advantage estimator) is a plain function called by keyword.
Its parameters that are in the caller's list of inputs are inputs; its keyword-only
parameters with a default are its settings (`algo.loss_settings`, `algo.advantage_settings`),
so the default lives once, in the signature, and validation reads the names and types from
there. `needs` says what the run must provide:

- ``critic``: a value model (PPO's), trained beside the policy;
- ``groups``: G >= 2 responses per prompt (`trainer.group_size`);
- ``response_advantage``: one advantage per response (not per token);
- ``greedy``: a greedy response per prompt, sampled and scored in the same step;
- ``reference``: the reference model's log-probs;
- ``minibatch_stats``: the current policy's log-probs and entropies over the whole
  mini-batch before its passes (a selection that must not depend on how it is split);
- ``step_rewards``: a reward per reasoning step (`reward=process`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

NEEDS = (
    "critic", "groups", "response_advantage", "greedy", "reference", "minibatch_stats",
    "step_rewards",
)  # fmt: skip


@dataclass(frozen=True)
class Piece:
    """A registered function and what its definition declares."""

    name: str
    fn: Callable
    inputs: frozenset[str]  # the caller's inputs it reads, by keyword
    settings: dict[str, object]  # its own settings, name -> default
    needs: frozenset[str] = field(default_factory=frozenset)
    doc: str = ""  # its docstring's first line, for --help

    def __call__(self, *args, **kwargs):
        """The function itself, called as written."""
        return self.fn(*args, **kwargs)

    def run(self, settings: dict, **available):
        """Call it with the inputs it names (of `available`) and its settings over the
        defaults."""
        return self.fn(**{k: available[k] for k in self.inputs}, **{**self.settings, **settings})


def piece(name: str, fn: Callable, inputs: tuple[str, ...], needs=()) -> Piece:
    """A `Piece` from `fn`'s signature; ValueError if it takes something that is neither an
    input nor a setting with a default."""
    unknown = set(needs) - set(NEEDS)
    if unknown:
        raise ValueError(f"{name}: unknown needs {sorted(unknown)}; valid: {', '.join(NEEDS)}")
    taken, settings = set(), {}
    for param in inspect.signature(fn).parameters.values():
        if param.name in inputs:
            taken.add(param.name)
        elif param.kind is param.KEYWORD_ONLY and param.default is not param.empty:
            settings[param.name] = param.default
        else:
            raise ValueError(
                f"{name}: parameter {param.name!r} is neither an input ({', '.join(inputs)}) "
                "nor a keyword-only setting with a default (def f(..., *, name=default))"
            )
    doc = (inspect.getdoc(fn) or "").split("\n")[0]
    return Piece(name, fn, frozenset(taken), settings, frozenset(needs), doc)


def registrar(registry: dict[str, Piece], inputs: tuple[str, ...]):
    """A decorator `register(name, needs=...)` that adds a function to `registry`."""

    def register(name: str, *, needs=()):
        def add(fn: Callable) -> Callable:
            if name in registry:
                raise ValueError(f"a piece named {name!r} is registered already")
            registry[name] = piece(name, fn, inputs, needs)
            return fn

        return add

    return register


def settings_problem(p: Piece, given: dict, where: str) -> str | None:
    """Why `given` are not valid settings of `p` (a sentence naming the bad key or value and
    the valid ones), or None."""
    valid = ", ".join(f"{k}={v!r}" for k, v in p.settings.items()) or "none"
    for key, value in given.items():
        if key not in p.settings:
            return f"{where}.{key} is not a setting of {p.name}; its settings are: {valid}."
        default = p.settings[key]
        if default is None or value is None:
            continue
        if isinstance(default, bool) != isinstance(value, bool):
            return f"{where}.{key}={value!r} must be a {type(default).__name__}, like {default!r}."
        number = isinstance(default, (int, float)) and isinstance(value, (int, float))
        if not number and not isinstance(value, type(default)):
            return f"{where}.{key}={value!r} must be a {type(default).__name__}, like {default!r}."
        if isinstance(default, int) and not isinstance(default, bool) and isinstance(value, float):
            if not value.is_integer():
                return f"{where}.{key}={value!r} must be a whole number, like {default!r}."
    return None
